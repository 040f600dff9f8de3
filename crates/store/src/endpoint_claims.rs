//! Which node runs each dedicated endpoint. Every node's reconciler reads
//! the endpoint rows; one node at a time holds an endpoint's claim and runs
//! its replicas, renewing the claim (and reporting how many replicas serve)
//! on every pass. A claim whose heartbeat is older than the node timeout
//! belonged to a node that died: any node that can run the endpoint takes
//! it over. Claims are conditional `UPDATE`s, atomic between nodes on
//! SQLite and PostgreSQL alike.

use sqlx::Row;

use crate::error::Result;
use crate::ids::now;
use crate::Store;

/// Who runs an endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointHost {
    /// The endpoint's id.
    pub id: String,
    /// The node holding its claim, if any.
    pub node: Option<String>,
    /// When that node last renewed it (seconds since the epoch).
    pub heartbeat_at: Option<i64>,
    /// Replicas serving on that node at its last renewal.
    pub ready_replicas: i64,
}

impl EndpointHost {
    /// Whether a node other than `node` holds the claim and renewed it at
    /// most `timeout_secs` before `now`.
    pub fn held_elsewhere(&self, node: &str, now: i64, timeout_secs: i64) -> bool {
        self.node.as_deref().is_some_and(|n| n != node)
            && self.heartbeat_at.is_some_and(|t| now - t <= timeout_secs)
    }
}

impl Store {
    /// The claims of every endpoint not deleted.
    pub async fn endpoint_hosts(&self) -> Result<Vec<EndpointHost>> {
        let rows = sqlx::query(
            "SELECT id, claimed_by, heartbeat_at, ready_replicas FROM dedicated_endpoints \
             WHERE status <> 'deleted' ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EndpointHost {
                    id: r.try_get("id")?,
                    node: r.try_get("claimed_by")?,
                    heartbeat_at: r.try_get("heartbeat_at")?,
                    ready_replicas: r.try_get("ready_replicas")?,
                })
            })
            .collect()
    }

    /// Takes or renews endpoint `id` for `node`, recording `ready_replicas`:
    /// applies when nobody holds it, `node` does, or the holder's heartbeat
    /// is older than `stale_after_secs`. Returns whether `node` holds it now.
    pub async fn claim_endpoint(
        &self,
        id: &str,
        node: &str,
        stale_after_secs: i64,
        ready_replicas: i64,
    ) -> Result<bool> {
        let now = now();
        let done = sqlx::query(
            "UPDATE dedicated_endpoints SET claimed_by = $1, heartbeat_at = $2, \
             ready_replicas = $3 WHERE id = $4 AND status NOT IN ('deleting', 'deleted') \
             AND (claimed_by IS NULL OR claimed_by = $1 OR heartbeat_at IS NULL \
             OR heartbeat_at < $5)",
        )
        .bind(node)
        .bind(now)
        .bind(ready_replicas)
        .bind(id)
        .bind(now - stale_after_secs)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives endpoint `id` back if `node` holds it (it cannot run it, and
    /// another node can); returns whether it did.
    pub async fn release_endpoint(&self, id: &str, node: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE dedicated_endpoints SET claimed_by = NULL, heartbeat_at = NULL, \
             ready_replicas = 0 WHERE id = $1 AND claimed_by = $2",
        )
        .bind(id)
        .bind(node)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives back every endpoint `node` holds (it shuts down in good
    /// order), for other nodes to take at once; how many.
    pub async fn release_endpoints(&self, node: &str) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE dedicated_endpoints SET claimed_by = NULL, heartbeat_at = NULL, \
             ready_replicas = 0 WHERE claimed_by = $1",
        )
        .bind(node)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
