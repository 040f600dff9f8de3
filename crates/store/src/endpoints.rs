//! Dedicated endpoints: a project's own replicas of one model, reached by a
//! routing key.
//!
//! A row is the desired state of one endpoint (its model, flavor, scaling
//! and whether it is enabled). Each server runs a reconciler that reads the
//! rows ([`Store::all_endpoints`]) and brings its running replicas in line
//! with them. `generation` is bumped by every change of what runs (flavor,
//! scaling, enabled, deletion; not name or description), so the reconciler
//! sees that a running endpoint must be reloaded: it acts on a row's
//! generation and reports back with [`Store::set_endpoint_status`], which
//! applies only while the row is still at that generation, so a report
//! about an older desired state never overwrites a newer one.
//!
//! `status` is written by the reconciler (`running`, `failed`, `stopped`,
//! ...) except for the transitions the API causes: a new row is
//! `provisioning` (or `stopped` when disabled), a change of what runs makes
//! it `updating`, `provisioning` or `stopping` ([`Store::update_endpoint`]),
//! and a delete makes it `deleting` ([`Store::mark_endpoint_deleting`]). A
//! `deleting` row is still read and listed, so the reconciler sees it and
//! stops its replicas; it then removes the row ([`Store::purge_endpoint`]),
//! which frees the routing key. Rows with status `deleted` (none are written
//! here) are ignored by every read.
//!
//! Every transition is one conditional `UPDATE ... WHERE id = $n AND <state
//! condition>` whose `rows_affected()` says whether it applied, so the same
//! SQL is atomic on SQLite and PostgreSQL without row locks.
//!
//! Lists are oldest first (`created_at`, then `id`).

use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::now;
use crate::Store;

/// The status of a new enabled endpoint, and of one whose replicas must be
/// started from nothing.
const PROVISIONING: &str = "provisioning";
/// The status of an enabled endpoint whose running replicas must be
/// reloaded for a new generation.
const UPDATING: &str = "updating";
/// The status of an endpoint just disabled, until its replicas are gone.
const STOPPING: &str = "stopping";
/// The status of a new disabled endpoint.
const STOPPED: &str = "stopped";
/// The status of a deleted endpoint until the reconciler purges it.
const DELETING: &str = "deleting";
/// What the reconciler reports when loading failed; a patch that names
/// any of `flavor_name`, the replica counts or `enabled: true` retries it.
const FAILED: &str = "failed";
/// A status no read returns.
const DELETED: &str = "deleted";

/// The SQL condition on `status` of the rows that reads return (all but
/// `deleted`).
const VISIBLE: &str = "status <> 'deleted'";
/// The SQL condition on `status` of the rows that can still change (neither
/// `deleting` nor `deleted`).
const LIVE: &str = "status NOT IN ('deleting', 'deleted')";

/// How many times [`Store::update_endpoint`] reads and writes again when a
/// concurrent change got in between.
const UPDATE_TRIES: usize = 5;

/// A dedicated endpoint row: the desired state of one endpoint, and the
/// status the reconciler last reported for it.
#[derive(Debug, Clone, PartialEq)]
pub struct DedicatedEndpoint {
    /// A UUID v4 string made by the caller.
    pub id: String,
    /// The project that owns it.
    pub project_id: String,
    /// The name its owner gave it.
    pub name: String,
    /// Its owner's description, if any.
    pub description: Option<String>,
    /// The model its replicas serve.
    pub model_name: String,
    /// What requests name to reach it; unique among the rows not purged.
    pub routing_key: String,
    /// The hardware flavor of each replica.
    pub flavor_name: String,
    /// The GPU type of the flavor, if it has one.
    pub gpu_type: Option<String>,
    /// GPUs per replica.
    pub gpu_count: i64,
    /// Where the replicas run.
    pub region: String,
    /// The fewest replicas to keep running while enabled.
    pub min_replicas: i64,
    /// The most replicas to run.
    pub max_replicas: i64,
    /// Whether replicas should run at all.
    pub enabled: bool,
    /// `provisioning`, `updating`, `stopping`, `stopped`, `deleting`, or
    /// whatever the reconciler last reported (`running`, `failed`, ...).
    pub status: String,
    /// Why the endpoint has its status (an error message), if the
    /// reconciler said.
    pub status_reason: Option<String>,
    /// Starts at 1; bumped by every change of what runs.
    pub generation: i64,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// When the row last changed (a status report that keeps the status
    /// does not count).
    pub updated_at: i64,
}

/// What [`Store::create_endpoint`] needs; everything already checked by the
/// caller (project, flavor, model, replica counts).
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    /// A UUID v4 string made by the caller.
    pub id: String,
    /// The project that owns it.
    pub project_id: String,
    /// The name its owner gives it.
    pub name: String,
    /// Its owner's description, if any.
    pub description: Option<String>,
    /// The model its replicas serve.
    pub model_name: String,
    /// What requests name to reach it; must not be taken.
    pub routing_key: String,
    /// The hardware flavor of each replica.
    pub flavor_name: String,
    /// The GPU type of the flavor, if it has one.
    pub gpu_type: Option<String>,
    /// GPUs per replica.
    pub gpu_count: i64,
    /// Where the replicas run.
    pub region: String,
    /// The fewest replicas to keep running while enabled.
    pub min_replicas: i64,
    /// The most replicas to run.
    pub max_replicas: i64,
    /// Whether replicas should run at once.
    pub enabled: bool,
}

/// A change to an endpoint ([`Store::update_endpoint`]): each field that is
/// `Some` replaces the row's value; `None` keeps it.
#[derive(Debug, Clone, Default)]
pub struct EndpointPatch {
    /// A new name.
    pub name: Option<String>,
    /// A new description: `Some(None)` clears it.
    pub description: Option<Option<String>>,
    /// A new flavor (a change of what runs).
    pub flavor_name: Option<String>,
    /// A new minimum of replicas (a change of what runs).
    pub min_replicas: Option<i64>,
    /// A new maximum of replicas (a change of what runs).
    pub max_replicas: Option<i64>,
    /// Starts or stops the endpoint (a change of what runs).
    pub enabled: Option<bool>,
}

const COLUMNS: &str = "id, project_id, name, description, model_name, routing_key, \
     flavor_name, gpu_type, gpu_count, region, min_replicas, max_replicas, enabled, status, \
     status_reason, generation, created_at, updated_at";

impl DedicatedEndpoint {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            name: row.try_get("name")?,
            description: row.try_get("description")?,
            model_name: row.try_get("model_name")?,
            routing_key: row.try_get("routing_key")?,
            flavor_name: row.try_get("flavor_name")?,
            gpu_type: row.try_get("gpu_type")?,
            gpu_count: row.try_get("gpu_count")?,
            region: row.try_get("region")?,
            min_replicas: row.try_get("min_replicas")?,
            max_replicas: row.try_get("max_replicas")?,
            enabled: row.try_get::<i64, _>("enabled")? != 0,
            status: row.try_get("status")?,
            status_reason: row.try_get("status_reason")?,
            generation: row.try_get("generation")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

/// Whether `e` is the database refusing a duplicate of a unique column.
fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// The status an endpoint gets when a patch changes what runs: `stopping`
/// when it becomes disabled (a disabled one that stays disabled keeps its
/// status); when enabled after the patch, `updating` if it was already
/// enabled and past `provisioning` (running replicas must be reloaded),
/// else `provisioning` (nothing runs yet).
fn status_after_change(old: &DedicatedEndpoint, enabled: bool) -> String {
    match (old.enabled, enabled) {
        (true, true) if old.status != PROVISIONING && old.status != FAILED => UPDATING.to_string(),
        (_, true) => PROVISIONING.to_string(),
        (true, false) => STOPPING.to_string(),
        (false, false) => old.status.clone(),
    }
}

impl Store {
    /// Creates an endpoint: status `provisioning` when enabled, `stopped`
    /// otherwise, generation 1, `created_at` = `updated_at` = now. A routing
    /// key that another row (even a `deleting` one) holds is refused with
    /// [`StoreError::InUse`] (409); so is an id already used. An unknown
    /// project is refused by the database.
    pub async fn create_endpoint(&self, new: NewEndpoint) -> Result<DedicatedEndpoint> {
        let at = now();
        let endpoint = DedicatedEndpoint {
            id: new.id,
            project_id: new.project_id,
            name: new.name,
            description: new.description,
            model_name: new.model_name,
            routing_key: new.routing_key,
            flavor_name: new.flavor_name,
            gpu_type: new.gpu_type,
            gpu_count: new.gpu_count,
            region: new.region,
            min_replicas: new.min_replicas,
            max_replicas: new.max_replicas,
            enabled: new.enabled,
            status: if new.enabled { PROVISIONING } else { STOPPED }.to_string(),
            status_reason: None,
            generation: 1,
            created_at: at,
            updated_at: at,
        };
        let inserted = sqlx::query(&format!(
            "INSERT INTO dedicated_endpoints ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
             $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
        ))
        .bind(&endpoint.id)
        .bind(&endpoint.project_id)
        .bind(&endpoint.name)
        .bind(endpoint.description.clone())
        .bind(&endpoint.model_name)
        .bind(&endpoint.routing_key)
        .bind(&endpoint.flavor_name)
        .bind(endpoint.gpu_type.clone())
        .bind(endpoint.gpu_count)
        .bind(&endpoint.region)
        .bind(endpoint.min_replicas)
        .bind(endpoint.max_replicas)
        .bind(i64::from(endpoint.enabled))
        .bind(&endpoint.status)
        .bind(endpoint.status_reason.clone())
        .bind(endpoint.generation)
        .bind(endpoint.created_at)
        .bind(endpoint.updated_at)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(endpoint),
            Err(e) if is_unique_violation(&e) => {
                // Which unique column: the routing key, or (a caller's bug)
                // the id.
                let key_taken =
                    sqlx::query("SELECT id FROM dedicated_endpoints WHERE routing_key = $1")
                        .bind(&endpoint.routing_key)
                        .fetch_optional(&self.pool)
                        .await?
                        .is_some();
                Err(StoreError::InUse(if key_taken {
                    format!(
                        "The routing key `{}` is already used by another dedicated endpoint.",
                        endpoint.routing_key
                    )
                } else {
                    format!(
                        "A dedicated endpoint with id `{}` already exists.",
                        endpoint.id
                    )
                }))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The endpoint `id` whatever its project (the API checks ownership),
    /// `deleting` ones included; [`StoreError::NotFound`] ("dedicated
    /// endpoint") when missing (purged, or `deleted`).
    pub async fn endpoint_by_id(&self, id: &str) -> Result<DedicatedEndpoint> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM dedicated_endpoints WHERE id = $1 AND {VISIBLE}"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => DedicatedEndpoint::from_row(&row),
            None => Err(StoreError::NotFound("dedicated endpoint")),
        }
    }

    /// The project's endpoints (`deleting` ones included, not `deleted`),
    /// oldest first.
    pub async fn list_endpoints(&self, project_id: &str) -> Result<Vec<DedicatedEndpoint>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM dedicated_endpoints WHERE project_id = $1 AND {VISIBLE} \
             ORDER BY created_at ASC, id ASC"
        ))
        .bind(project_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(DedicatedEndpoint::from_row).collect()
    }

    /// Every endpoint (`deleting` ones included, not `deleted`) of every
    /// project, oldest first: the reconciler's view.
    pub async fn all_endpoints(&self) -> Result<Vec<DedicatedEndpoint>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM dedicated_endpoints WHERE {VISIBLE} \
             ORDER BY created_at ASC, id ASC"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(DedicatedEndpoint::from_row).collect()
    }

    /// The endpoint that holds `routing_key` (not `deleted`), whatever its
    /// project; `None` when none does. A `deleting` endpoint still holds its
    /// key until it is purged, and is returned: the caller checks `status`
    /// and `enabled` before routing to it.
    pub async fn endpoint_by_routing_key(
        &self,
        routing_key: &str,
    ) -> Result<Option<DedicatedEndpoint>> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM dedicated_endpoints WHERE routing_key = $1 AND {VISIBLE}"
        ))
        .bind(routing_key)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(DedicatedEndpoint::from_row).transpose()
    }

    /// Applies `patch` to the endpoint `id` ([`StoreError::NotFound`] when
    /// missing, `deleting` or `deleted`) and returns the new row;
    /// `updated_at` = now. When the patch changes what runs (a
    /// `flavor_name`, `min_replicas`, `max_replicas` or `enabled` that
    /// differs from the row's), `generation` goes up by one, the status
    /// reason is cleared, and the status becomes:
    ///
    /// - `stopping` when the endpoint becomes disabled (one that was
    ///   disabled and stays so keeps its status);
    /// - `updating` when it stays enabled and was past `provisioning`
    ///   (its running replicas must be reloaded);
    /// - `provisioning` when it stays enabled and was `provisioning`, or
    ///   becomes enabled (nothing runs yet).
    ///
    /// A patch of the name or description only keeps the generation and
    /// the status. On a `failed` endpoint that stays enabled, a patch that
    /// names `flavor_name`, a replica count or `enabled` (even unchanged)
    /// is a retry: a new generation, `provisioning`.
    ///
    /// One read, then one `UPDATE ... WHERE id = $n AND generation = $old`
    /// (and the old status, when the new one is computed from it) that sets
    /// only the patched columns; when a concurrent change got in between
    /// (nothing updated), the read and the write are tried again, up to
    /// five times, after which [`StoreError::InUse`] (409) says so.
    pub async fn update_endpoint(
        &self,
        id: &str,
        patch: &EndpointPatch,
    ) -> Result<DedicatedEndpoint> {
        for _ in 0..UPDATE_TRIES {
            let old = self.endpoint_by_id(id).await?;
            if old.status == DELETING || old.status == DELETED {
                return Err(StoreError::NotFound("dedicated endpoint"));
            }
            let flavor_name = patch
                .flavor_name
                .clone()
                .unwrap_or_else(|| old.flavor_name.clone());
            let min_replicas = patch.min_replicas.unwrap_or(old.min_replicas);
            let max_replicas = patch.max_replicas.unwrap_or(old.max_replicas);
            let enabled = patch.enabled.unwrap_or(old.enabled);
            let retries = old.status == FAILED
                && enabled
                && (patch.flavor_name.is_some()
                    || patch.min_replicas.is_some()
                    || patch.max_replicas.is_some()
                    || patch.enabled.is_some());
            let changes_what_runs = flavor_name != old.flavor_name
                || min_replicas != old.min_replicas
                || max_replicas != old.max_replicas
                || enabled != old.enabled
                || retries;

            let mut new = old.clone();
            new.updated_at = now();
            let mut sets = vec!["updated_at = $1".to_string()];
            let mut n = 1;
            let mut next = |column: &str| {
                n += 1;
                sets.push(format!("{column} = ${n}"));
            };
            if let Some(name) = &patch.name {
                new.name = name.clone();
                next("name");
            }
            if let Some(description) = &patch.description {
                new.description = description.clone();
                next("description");
            }
            if changes_what_runs {
                new.flavor_name = flavor_name;
                new.min_replicas = min_replicas;
                new.max_replicas = max_replicas;
                new.enabled = enabled;
                new.status = status_after_change(&old, enabled);
                new.status_reason = None;
                new.generation = old.generation + 1;
                for column in [
                    "flavor_name",
                    "min_replicas",
                    "max_replicas",
                    "enabled",
                    "status",
                    "status_reason",
                    "generation",
                ] {
                    next(column);
                }
            }
            let mut sql = format!(
                "UPDATE dedicated_endpoints SET {} WHERE id = ${} AND generation = ${} AND {LIVE}",
                sets.join(", "),
                n + 1,
                n + 2
            );
            if changes_what_runs {
                // The new status is computed from the old one, which the
                // reconciler may change without a new generation.
                sql.push_str(&format!(" AND status = ${}", n + 3));
            }

            let mut query = sqlx::query(&sql).bind(new.updated_at);
            if patch.name.is_some() {
                query = query.bind(new.name.clone());
            }
            if patch.description.is_some() {
                query = query.bind(new.description.clone());
            }
            if changes_what_runs {
                query = query
                    .bind(new.flavor_name.clone())
                    .bind(new.min_replicas)
                    .bind(new.max_replicas)
                    .bind(i64::from(new.enabled))
                    .bind(new.status.clone())
                    .bind(new.status_reason.clone())
                    .bind(new.generation);
            }
            query = query.bind(id.to_string()).bind(old.generation);
            if changes_what_runs {
                query = query.bind(old.status.clone());
            }
            let done = query.execute(&self.pool).await?;
            if done.rows_affected() == 1 {
                if !changes_what_runs {
                    // Columns this patch left alone (the status) may have
                    // changed since the read: return the row as it is.
                    return self.endpoint_by_id(id).await;
                }
                return Ok(new);
            }
        }
        Err(StoreError::InUse(format!(
            "The dedicated endpoint {id} is being changed by another request; try again."
        )))
    }

    /// Marks the endpoint `id` `deleting` (generation + 1, status reason
    /// cleared, `updated_at` = now) for the reconciler to stop its replicas
    /// and purge it; [`StoreError::NotFound`] when missing or already
    /// `deleting` or `deleted`. Returns the row.
    pub async fn mark_endpoint_deleting(&self, id: &str) -> Result<DedicatedEndpoint> {
        let done = sqlx::query(&format!(
            "UPDATE dedicated_endpoints SET status = $1, status_reason = NULL, \
             generation = generation + 1, updated_at = $2 WHERE id = $3 AND {LIVE}"
        ))
        .bind(DELETING)
        .bind(now())
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound("dedicated endpoint"));
        }
        self.endpoint_by_id(id).await
    }

    /// The reconciler's write: sets the status and its reason while the row
    /// is still at `generation` and is not `deleting` or `deleted`; returns
    /// whether it applied (`false` for a missing row, or one that changed
    /// since the reconciler read it). `updated_at` changes only when the
    /// status does. `status` may not be `deleting` or `deleted`
    /// ([`StoreError::Invalid`]): those come from
    /// [`Store::mark_endpoint_deleting`] and [`Store::purge_endpoint`].
    pub async fn set_endpoint_status(
        &self,
        id: &str,
        generation: i64,
        status: &str,
        reason: Option<&str>,
    ) -> Result<bool> {
        if status == DELETING || status == DELETED {
            return Err(StoreError::Invalid(format!(
                "the reconciler cannot set a dedicated endpoint's status to `{status}`"
            )));
        }
        let done = sqlx::query(&format!(
            "UPDATE dedicated_endpoints SET status = $1, status_reason = $2, \
             updated_at = CASE WHEN status = $1 THEN updated_at ELSE $3 END \
             WHERE id = $4 AND generation = $5 AND {LIVE}"
        ))
        .bind(status)
        .bind(reason)
        .bind(now())
        .bind(id)
        .bind(generation)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Removes the endpoint `id` if it is `deleting` (or `deleted`): the
    /// reconciler calls it once the replicas are gone. The row is deleted,
    /// so its routing key can be used again. Returns whether a row was
    /// removed (not for a missing row, nor one that is not being deleted).
    pub async fn purge_endpoint(&self, id: &str) -> Result<bool> {
        let done = sqlx::query(
            "DELETE FROM dedicated_endpoints WHERE id = $1 AND status IN ('deleting', 'deleted')",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// How many endpoints (not `deleted`) each status has, statuses without
    /// any left out, in the order of the status names: for `/metrics`.
    pub async fn endpoint_counts_by_status(&self) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query(&format!(
            "SELECT status, COUNT(*) AS n FROM dedicated_endpoints WHERE {VISIBLE} \
             GROUP BY status ORDER BY status ASC"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("status")?, row.try_get::<i64, _>("n")?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(enabled: bool, status: &str) -> DedicatedEndpoint {
        DedicatedEndpoint {
            id: "00000000-0000-4000-8000-000000000001".to_string(),
            project_id: "project-x".to_string(),
            name: "e".to_string(),
            description: None,
            model_name: "m".to_string(),
            routing_key: "k".to_string(),
            flavor_name: "f".to_string(),
            gpu_type: None,
            gpu_count: 1,
            region: "r".to_string(),
            min_replicas: 1,
            max_replicas: 1,
            enabled,
            status: status.to_string(),
            status_reason: None,
            generation: 1,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn status_after_a_change_of_what_runs() {
        let cases = [
            (true, "running", true, UPDATING),
            (true, FAILED, true, PROVISIONING),
            (true, UPDATING, true, UPDATING),
            (true, PROVISIONING, true, PROVISIONING),
            (false, STOPPED, true, PROVISIONING),
            (false, STOPPING, true, PROVISIONING),
            (true, "running", false, STOPPING),
            (true, PROVISIONING, false, STOPPING),
            (false, STOPPED, false, STOPPED),
            (false, STOPPING, false, STOPPING),
        ];
        for (was_enabled, status, enabled, expected) in cases {
            assert_eq!(
                status_after_change(&endpoint(was_enabled, status), enabled),
                expected,
                "{was_enabled} {status} -> {enabled}"
            );
        }
    }
}
