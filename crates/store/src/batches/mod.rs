//! Batches (`/v1/batches`) and the results of their requests.
//!
//! A batch is created `validating` by the API ([`Store::create_batch`]). A
//! worker (hearth-jobs) takes it with [`Store::claim_batch`] (`claimed_by`,
//! `heartbeat_at`, one more of its `attempts`; see `claims.rs`), reads and
//! checks its input file, and either fails it ([`Store::fail_batch`]) or
//! starts it ([`Store::start_batch`]: `in_progress`, with its model and its
//! number of requests). Each request's result is recorded as it comes
//! ([`Store::add_batch_result`]), so a batch taken over after a crash runs
//! only the lines without one. At the end the worker writes the output and
//! error files from the recorded results and ends the batch
//! ([`Store::finalize_batch`], then [`Store::finish_batch`]: `completed`,
//! `expired` or `cancelled`), which drops the results.
//!
//! [`Store::cancel_batch`] ends a batch no worker holds yet at once; one
//! that a worker holds becomes `cancelling`, which the worker learns at its
//! next heartbeat and ends as `cancelled` with the results so far.
//!
//! Every claim and transition is one conditional `UPDATE ... WHERE id = $n
//! AND <state condition>` whose `rows_affected()` says whether it applied, so
//! the same SQL is atomic on SQLite and PostgreSQL without row locks.
//!
//! Lists are newest first and page with `after` = an id: the page holds the
//! batches created before it (ids sort by creation).

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

mod claims;

pub use claims::BatchClaimRules;

/// `status` of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub const ALL: [BatchStatus; 8] = [
        BatchStatus::Validating,
        BatchStatus::Failed,
        BatchStatus::InProgress,
        BatchStatus::Finalizing,
        BatchStatus::Completed,
        BatchStatus::Expired,
        BatchStatus::Cancelling,
        BatchStatus::Cancelled,
    ];

    /// The wire and database value: `validating`, `failed`, `in_progress`,
    /// `finalizing`, `completed`, `expired`, `cancelling`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }

    /// The status named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Whether the batch is over (`failed`, `completed`, `expired` or
    /// `cancelled`).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }
}

impl std::fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The SQL list of the statuses a worker has work in (the non-terminal
/// ones).
const ACTIVE: &str = "('validating', 'in_progress', 'finalizing', 'cancelling')";

/// A batch row.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `batch-<ULID>`.
    pub id: String,
    pub project_id: String,
    /// The endpoint every request goes to (`/v1/chat/completions`, ...).
    pub endpoint: String,
    /// `24h`.
    pub completion_window: String,
    /// A file of the batch's project (purpose `batch`).
    pub input_file_id: String,
    pub status: BatchStatus,
    /// The caller's JSON object, if any.
    pub metadata: Option<Value>,
    /// Request fields the batch sets on every line (a JSON object), if any.
    pub override_settings: Option<Value>,
    /// The one model of the batch's requests, set when validation passes.
    pub model: Option<String>,
    /// Request counts: every line, those that succeeded, those that failed.
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
    /// Files the batch wrote when it ended (purpose `batch_output`).
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// A JSON list of `{code, message, param, line}` when validation failed.
    pub errors: Option<Value>,
    pub created_at: i64,
    /// When the completion window ends.
    pub expires_at: i64,
    pub in_progress_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    /// The worker running the batch (cleared when the batch ends or is
    /// given back).
    pub claimed_by: Option<String>,
    /// When that worker last said it is alive.
    pub heartbeat_at: Option<i64>,
    /// How many times a worker claimed the batch (see [`BatchClaimRules`]).
    pub attempts: i64,
}

/// What [`Store::create_batch`] needs; everything already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    pub project_id: String,
    pub endpoint: String,
    pub completion_window: String,
    pub input_file_id: String,
    /// A JSON object, if any.
    pub metadata: Option<Value>,
    /// A JSON object, if any.
    pub override_settings: Option<Value>,
    /// Absolute, in seconds since the epoch.
    pub expires_at: i64,
}

/// One request's result, kept until the batch's result files are written.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchResult {
    /// The request's line in the input file.
    pub line: i64,
    /// Whether it goes to the output file (else to the error file).
    pub ok: bool,
    /// The whole output or error JSONL line, without its newline.
    pub body: String,
}

/// Whether `id` has the shape of a batch id (`batch-<ULID>`).
pub fn is_well_formed_batch_id(id: &str) -> bool {
    ids::is_well_formed(ids::BATCH, id)
}

const COLUMNS: &str = "id, project_id, endpoint, completion_window, input_file_id, status, \
     metadata, override_settings, model, total, completed, failed, output_file_id, \
     error_file_id, errors, created_at, expires_at, in_progress_at, finalizing_at, \
     completed_at, failed_at, expired_at, cancelling_at, cancelled_at, claimed_by, \
     heartbeat_at, attempts";

fn parse_opt_json(column: &str, text: Option<String>) -> Result<Option<Value>> {
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Invalid(format!("stored `{column}` is not JSON: {e}")))
    })
    .transpose()
}

impl Batch {
    fn from_row(row: &AnyRow) -> Result<Self> {
        let status: String = row.try_get("status")?;
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            endpoint: row.try_get("endpoint")?,
            completion_window: row.try_get("completion_window")?,
            input_file_id: row.try_get("input_file_id")?,
            status: BatchStatus::parse(&status).ok_or_else(|| {
                StoreError::Invalid(format!("stored batch status `{status}` is unknown"))
            })?,
            metadata: parse_opt_json("metadata", row.try_get("metadata")?)?,
            override_settings: parse_opt_json(
                "override_settings",
                row.try_get("override_settings")?,
            )?,
            model: row.try_get("model")?,
            total: row.try_get("total")?,
            completed: row.try_get("completed")?,
            failed: row.try_get("failed")?,
            output_file_id: row.try_get("output_file_id")?,
            error_file_id: row.try_get("error_file_id")?,
            errors: parse_opt_json("errors", row.try_get("errors")?)?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            in_progress_at: row.try_get("in_progress_at")?,
            finalizing_at: row.try_get("finalizing_at")?,
            completed_at: row.try_get("completed_at")?,
            failed_at: row.try_get("failed_at")?,
            expired_at: row.try_get("expired_at")?,
            cancelling_at: row.try_get("cancelling_at")?,
            cancelled_at: row.try_get("cancelled_at")?,
            claimed_by: row.try_get("claimed_by")?,
            heartbeat_at: row.try_get("heartbeat_at")?,
            attempts: row.try_get("attempts")?,
        })
    }
}

impl BatchResult {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            line: row.try_get("line")?,
            ok: row.try_get::<i64, _>("ok")? != 0,
            body: row.try_get("body")?,
        })
    }
}

impl Store {
    /// Creates a batch, `validating`, its counts 0. The caller has checked
    /// everything (endpoint, window, input file).
    pub async fn create_batch(&self, new: NewBatch) -> Result<Batch> {
        let batch = Batch {
            id: new_id(ids::BATCH),
            project_id: new.project_id,
            endpoint: new.endpoint,
            completion_window: new.completion_window,
            input_file_id: new.input_file_id,
            status: BatchStatus::Validating,
            metadata: new.metadata,
            override_settings: new.override_settings,
            model: None,
            total: 0,
            completed: 0,
            failed: 0,
            output_file_id: None,
            error_file_id: None,
            errors: None,
            created_at: now(),
            expires_at: new.expires_at,
            in_progress_at: None,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            claimed_by: None,
            heartbeat_at: None,
            attempts: 0,
        };
        sqlx::query(
            "INSERT INTO batches (id, project_id, endpoint, completion_window, input_file_id, \
             status, metadata, override_settings, total, completed, failed, created_at, \
             expires_at, attempts) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(&batch.id)
        .bind(&batch.project_id)
        .bind(&batch.endpoint)
        .bind(&batch.completion_window)
        .bind(&batch.input_file_id)
        .bind(batch.status.as_str())
        .bind(batch.metadata.as_ref().map(Value::to_string))
        .bind(batch.override_settings.as_ref().map(Value::to_string))
        .bind(batch.total)
        .bind(batch.completed)
        .bind(batch.failed)
        .bind(batch.created_at)
        .bind(batch.expires_at)
        .bind(batch.attempts)
        .execute(&self.pool)
        .await?;
        Ok(batch)
    }

    /// The batch `id` whatever its project ([`StoreError::NotFound`] when
    /// missing): the caller checks the project (the API), or has none to
    /// check (the worker).
    pub async fn batch_by_id(&self, id: &str) -> Result<Batch> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM batches WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => Batch::from_row(&row),
            None => Err(StoreError::NotFound("batch")),
        }
    }

    /// A page of the project's batches, newest first: at most `limit`,
    /// created before the batch `after` when given, only those reading
    /// `input_file_id` when given. Returns the page and whether more follow.
    pub async fn list_batches(
        &self,
        project_id: &str,
        limit: i64,
        after: Option<&str>,
        input_file_id: Option<&str>,
    ) -> Result<(Vec<Batch>, bool)> {
        let mut sql = format!("SELECT {COLUMNS} FROM batches WHERE project_id = $1");
        let mut n = 1;
        if after.is_some() {
            n += 1;
            sql.push_str(&format!(" AND id < ${n}"));
        }
        if input_file_id.is_some() {
            n += 1;
            sql.push_str(&format!(" AND input_file_id = ${n}"));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", n + 1));
        let mut query = sqlx::query(&sql).bind(project_id);
        if let Some(after) = after {
            query = query.bind(after);
        }
        if let Some(file) = input_file_id {
            query = query.bind(file);
        }
        let limit = limit.max(0);
        let rows = query.bind(limit + 1).fetch_all(&self.pool).await?;
        let mut batches = rows
            .iter()
            .map(Batch::from_row)
            .collect::<Result<Vec<_>>>()?;
        let has_more = batches.len() > limit as usize;
        batches.truncate(limit as usize);
        Ok((batches, has_more))
    }

    /// Cancels the batch. One that no worker holds yet (`validating`,
    /// unclaimed) becomes `cancelled` at once; one a worker holds
    /// (`validating` claimed, or `in_progress`) becomes `cancelling`, and
    /// its worker ends it `cancelled` with the results so far. Both get
    /// `cancelling_at`. A `cancelling` or `cancelled` batch is returned as it
    /// is. A `failed`, `completed`, `expired` or `finalizing` batch cannot be
    /// cancelled: [`StoreError::Invalid`] ("cannot cancel a batch that is
    /// completed"); the API answers it 400. [`StoreError::NotFound`] for a
    /// missing batch or one of another project.
    pub async fn cancel_batch(&self, project_id: &str, id: &str) -> Result<Batch> {
        // One statement, so that a worker's claim cannot slip between the
        // test of `claimed_by` and the change of status.
        sqlx::query(
            "UPDATE batches SET \
             status = CASE WHEN status = 'validating' AND claimed_by IS NULL \
                 THEN 'cancelled' ELSE 'cancelling' END, \
             cancelled_at = CASE WHEN status = 'validating' AND claimed_by IS NULL \
                 THEN $1 ELSE cancelled_at END, \
             cancelling_at = $1 \
             WHERE project_id = $2 AND id = $3 AND status IN ('validating', 'in_progress')",
        )
        .bind(now())
        .bind(project_id)
        .bind(id)
        .execute(&self.pool)
        .await?;
        let batch = self.batch_by_id(id).await?;
        if batch.project_id != project_id {
            return Err(StoreError::NotFound("batch"));
        }
        match batch.status {
            BatchStatus::Cancelling | BatchStatus::Cancelled => Ok(batch),
            // A batch a worker released in between, or a race lost to a
            // transition: cannot be cancelled now.
            status => Err(StoreError::Invalid(format!(
                "cannot cancel a batch that is {status}"
            ))),
        }
    }

    /// How many batches each status has (statuses without any are left
    /// out), for `/metrics`.
    pub async fn batch_counts_by_status(&self) -> Result<Vec<(BatchStatus, i64)>> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM batches GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in &rows {
            let status: String = row.try_get("status")?;
            let status = BatchStatus::parse(&status).ok_or_else(|| {
                StoreError::Invalid(format!("stored batch status `{status}` is unknown"))
            })?;
            counts.push((status, row.try_get::<i64, _>("n")?));
        }
        Ok(counts)
    }

    /// Ids of the batches not yet over that read `file_id` as their input.
    pub(crate) async fn batches_using_file(&self, file_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(&format!(
            "SELECT id FROM batches WHERE input_file_id = $1 AND status IN {ACTIVE} \
             ORDER BY id ASC"
        ))
        .bind(file_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("id")?))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for status in BatchStatus::ALL {
            assert_eq!(BatchStatus::parse(status.as_str()), Some(status));
            assert_eq!(status.to_string(), status.as_str());
        }
        assert_eq!(BatchStatus::parse("running"), None);
        let terminal: Vec<_> = BatchStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(BatchStatus::as_str)
            .collect();
        assert_eq!(terminal, ["failed", "completed", "expired", "cancelled"]);
        for status in BatchStatus::ALL {
            assert_eq!(
                ACTIVE.contains(&format!("'{status}'")),
                !status.is_terminal(),
                "{status}"
            );
        }
    }
}
