//! The registry of nodes: every `hearth serve` sharing this store registers
//! itself (its id, the address other nodes and load balancers reach it at,
//! the models it serves and its free capacity) and renews a heartbeat; a
//! node whose heartbeat is older than a timeout is gone. Registration is an
//! upsert, so a node restarted under the same id takes its row back.

use serde_json::Value;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::now;
use crate::Store;

/// One node's row.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: String,
    /// Base URL of its API (`http://10.0.0.5:8000`), when it says.
    pub advertise_url: Option<String>,
    /// Model ids it serves.
    pub models: Vec<String>,
    /// Its free capacity (free-form JSON the node reports).
    pub capacity: Value,
    pub started_at: i64,
    pub heartbeat_at: i64,
}

impl NodeRecord {
    /// Whether the heartbeat is at most `timeout_secs` old at `now`.
    pub fn alive_at(&self, now: i64, timeout_secs: i64) -> bool {
        now - self.heartbeat_at <= timeout_secs
    }
}

impl Store {
    /// Registers (or re-registers) node `id`, heartbeat now.
    pub async fn register_node(
        &self,
        id: &str,
        advertise_url: Option<&str>,
        models: &[String],
        capacity: &Value,
    ) -> Result<()> {
        let now = now();
        sqlx::query(
            "INSERT INTO nodes (id, advertise_url, models, capacity, started_at, heartbeat_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET advertise_url = excluded.advertise_url, \
             models = excluded.models, capacity = excluded.capacity, \
             started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
        )
        .bind(id)
        .bind(advertise_url)
        .bind(Value::from(models.to_vec()).to_string())
        .bind(capacity.to_string())
        .bind(now)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Renews node `id`'s heartbeat, the models (and dedicated endpoint
    /// routing keys) it serves now and its reported capacity. False when
    /// its row is gone (forgotten as dead by another node): it must
    /// register again.
    pub async fn node_heartbeat(
        &self,
        id: &str,
        models: &[String],
        capacity: &Value,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET heartbeat_at = $1, models = $2, capacity = $3 WHERE id = $4",
        )
        .bind(now())
        .bind(Value::from(models.to_vec()).to_string())
        .bind(capacity.to_string())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Removes node `id` (on a clean shutdown).
    pub async fn deregister_node(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM nodes WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every registered node, by id (alive or not: see
    /// [`NodeRecord::alive_at`]).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let rows = sqlx::query(
            "SELECT id, advertise_url, models, capacity, started_at, heartbeat_at \
             FROM nodes ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let models: String = r.try_get("models")?;
                let capacity: String = r.try_get("capacity")?;
                Ok(NodeRecord {
                    id: r.try_get("id")?,
                    advertise_url: r.try_get("advertise_url")?,
                    models: serde_json::from_str(&models).map_err(|e| bad_json("models", e))?,
                    capacity: serde_json::from_str(&capacity)
                        .map_err(|e| bad_json("capacity", e))?,
                    started_at: r.try_get("started_at")?,
                    heartbeat_at: r.try_get("heartbeat_at")?,
                })
            })
            .collect()
    }

    /// Deletes the rows of nodes silent for more than `older_than_secs`;
    /// returns how many.
    pub async fn forget_dead_nodes(&self, older_than_secs: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM nodes WHERE heartbeat_at < $1")
            .bind(now() - older_than_secs)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

fn bad_json(column: &str, e: serde_json::Error) -> StoreError {
    StoreError::Invalid(format!("stored node `{column}` is not JSON: {e}"))
}
