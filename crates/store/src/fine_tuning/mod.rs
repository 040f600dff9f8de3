//! Fine-tuning jobs, their events and their checkpoints.
//!
//! A job is created `queued` by the API ([`Store::create_ft_job`]) once every
//! check knowable at creation has passed. A worker (hearth-jobs) then takes it
//! with [`Store::claim_ft_job`] (`running`, `claimed_by`, `heartbeat_at`,
//! one more of its `attempts`; see `claims.rs`),
//! keeps it alive with [`Store::heartbeat_ft_job`] (false once the job was
//! cancelled: the worker stops), reports progress, events and checkpoints,
//! and ends it with [`Store::finish_ft_job`] (`succeeded` or `failed`; never
//! over a `cancelled` job). [`Store::cancel_ft_job`] is immediate.
//!
//! Every claim and transition is one conditional `UPDATE ... WHERE id = $n
//! AND <state condition>` whose `rows_affected()` says whether it applied, so
//! the same SQL is atomic on SQLite and PostgreSQL without row locks.
//!
//! Checkpoint blobs live under `fine_tuning/<job-id>/...` (see
//! [`ft_blob_prefix`]); the orphan sweep never touches them.
//!
//! Lists are newest first and page with `after` = an id: the page holds the
//! items created before it (ids sort by creation).

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::files::FileRecord;
use crate::ids::{self, new_id, now};
use crate::Store;

mod claims;
mod records;
mod results;

pub use claims::{ClaimRules, DEFAULT_MAX_ATTEMPTS};
pub use results::{NewCheckpoint, ResultFile, RESULTS_PURPOSE};

/// `status` of a fine-tuning job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FtStatus {
    ValidatingFiles,
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl FtStatus {
    pub const ALL: [FtStatus; 6] = [
        FtStatus::ValidatingFiles,
        FtStatus::Queued,
        FtStatus::Running,
        FtStatus::Succeeded,
        FtStatus::Failed,
        FtStatus::Cancelled,
    ];

    /// The wire and database value: `validating_files`, `queued`, `running`,
    /// `succeeded`, `failed`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            FtStatus::ValidatingFiles => "validating_files",
            FtStatus::Queued => "queued",
            FtStatus::Running => "running",
            FtStatus::Succeeded => "succeeded",
            FtStatus::Failed => "failed",
            FtStatus::Cancelled => "cancelled",
        }
    }

    /// The status named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Whether the job is over (`succeeded`, `failed` or `cancelled`).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            FtStatus::Succeeded | FtStatus::Failed | FtStatus::Cancelled
        )
    }
}

impl std::fmt::Display for FtStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The SQL list of the non-terminal statuses.
pub(crate) const ACTIVE: &str = "('validating_files', 'queued', 'running')";

/// A fine-tuning job row.
#[derive(Debug, Clone, PartialEq)]
pub struct FtJob {
    /// `ftjob-<ULID>`.
    pub id: String,
    pub project_id: String,
    /// The base model's catalogue id.
    pub model: String,
    /// File ids (of the job's project, purpose `fine-tune`).
    pub training_file: String,
    pub validation_file: Option<String>,
    pub suffix: Option<String>,
    pub seed: i64,
    /// The resolved hyperparameters (every default filled), as the API's
    /// `Hyperparameters` serialises them.
    pub hyperparameters: Value,
    /// `supervised`.
    pub method: String,
    pub status: FtStatus,
    /// Set when the job succeeded.
    pub fine_tuned_model: Option<String>,
    pub trained_tokens: Option<i64>,
    pub trained_steps: i64,
    pub total_steps: Option<i64>,
    /// File ids the job wrote (the metrics CSV, purpose `fine-tune-results`).
    pub result_files: Vec<String>,
    /// `{code, message, param}` when the job failed.
    pub error: Option<Value>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// The worker running (or last running) the job.
    pub claimed_by: Option<String>,
    /// When that worker last said it is alive.
    pub heartbeat_at: Option<i64>,
    /// How many times a worker claimed the job (see [`ClaimRules`]).
    pub attempts: i64,
    /// The client's string pairs (a JSON object), if it gave any.
    pub metadata: Option<Value>,
}

/// What [`Store::create_ft_job`] needs; everything already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NewFtJob {
    pub project_id: String,
    pub model: String,
    pub training_file: String,
    pub validation_file: Option<String>,
    pub suffix: Option<String>,
    pub seed: i64,
    pub hyperparameters: Value,
    pub method: String,
    /// A JSON object of string pairs, or none.
    pub metadata: Option<Value>,
}

/// One event of a job's log.
#[derive(Debug, Clone, PartialEq)]
pub struct FtEvent {
    /// `ftevent-<ULID>`.
    pub id: String,
    pub job_id: String,
    pub created_at: i64,
    /// `info`, `warn` or `error`.
    pub level: String,
    /// `message` or `metrics` (the wire's `type`).
    pub kind: String,
    pub message: String,
    pub data: Option<Value>,
}

impl FtEvent {
    /// A new event of the job's log, stamped now.
    pub(crate) fn new(
        job_id: &str,
        level: &str,
        kind: &str,
        message: &str,
        data: Option<Value>,
    ) -> Self {
        Self {
            id: new_id(ids::FT_EVENT),
            job_id: job_id.to_string(),
            created_at: now(),
            level: level.to_string(),
            kind: kind.to_string(),
            message: message.to_string(),
            data,
        }
    }
}

/// One checkpoint of a job (a LoRA adapter saved at a step).
#[derive(Debug, Clone, PartialEq)]
pub struct FtCheckpoint {
    /// `ftckpt-<ULID>`.
    pub id: String,
    pub job_id: String,
    pub created_at: i64,
    pub step_number: i64,
    /// The model name the checkpoint can be served as.
    pub fine_tuned_model_checkpoint: String,
    /// A JSON object (`step`, `train_loss`, ...).
    pub metrics: Value,
    /// Where its blobs live (under [`ft_blob_prefix`] of the job).
    pub blob_prefix: String,
    /// Ids of the files its adapter is published as (`adapter_model.safetensors`,
    /// `adapter_config.json`; purpose `fine-tune-results`, in the job's
    /// project); empty for checkpoints written before publishing existed.
    pub result_files: Vec<String>,
}

/// The blob prefix of a job's checkpoints and adapters:
/// `fine_tuning/<job-id>`.
pub fn ft_blob_prefix(job_id: &str) -> String {
    format!("fine_tuning/{job_id}")
}

/// Whether `id` has the shape of a job id (`ftjob-<ULID>`).
pub fn is_well_formed_job_id(id: &str) -> bool {
    ids::is_well_formed(ids::FT_JOB, id)
}

const JOB_COLUMNS: &str = "id, project_id, model, training_file, validation_file, suffix, seed, \
     hyperparameters, method, status, fine_tuned_model, trained_tokens, trained_steps, \
     total_steps, result_files, error, created_at, finished_at, claimed_by, heartbeat_at, attempts, \
     metadata";

const EVENT_COLUMNS: &str = "id, job_id, created_at, level, type, message, data";

const CHECKPOINT_COLUMNS: &str = "id, job_id, created_at, step_number, \
     fine_tuned_model_checkpoint, metrics, blob_prefix, result_files";

fn parse_json(column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Invalid(format!("stored `{column}` is not JSON: {e}")))
}

fn parse_opt_json(column: &str, text: Option<String>) -> Result<Option<Value>> {
    text.map(|t| parse_json(column, &t)).transpose()
}

fn parse_id_list(column: &str, text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Invalid(format!("stored `{column}` is not a JSON list: {e}")))
}

impl FtJob {
    fn from_row(row: &AnyRow) -> Result<Self> {
        let status: String = row.try_get("status")?;
        let hyperparameters: String = row.try_get("hyperparameters")?;
        let result_files: String = row.try_get("result_files")?;
        let result_files = parse_id_list("result_files", &result_files)?;
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            model: row.try_get("model")?,
            training_file: row.try_get("training_file")?,
            validation_file: row.try_get("validation_file")?,
            suffix: row.try_get("suffix")?,
            seed: row.try_get("seed")?,
            hyperparameters: parse_json("hyperparameters", &hyperparameters)?,
            method: row.try_get("method")?,
            status: FtStatus::parse(&status).ok_or_else(|| {
                StoreError::Invalid(format!("stored job status `{status}` is unknown"))
            })?,
            fine_tuned_model: row.try_get("fine_tuned_model")?,
            trained_tokens: row.try_get("trained_tokens")?,
            trained_steps: row.try_get("trained_steps")?,
            total_steps: row.try_get("total_steps")?,
            result_files,
            error: parse_opt_json("error", row.try_get("error")?)?,
            created_at: row.try_get("created_at")?,
            finished_at: row.try_get("finished_at")?,
            claimed_by: row.try_get("claimed_by")?,
            heartbeat_at: row.try_get("heartbeat_at")?,
            attempts: row.try_get("attempts")?,
            metadata: parse_opt_json("metadata", row.try_get("metadata")?)?,
        })
    }
}

impl FtEvent {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            job_id: row.try_get("job_id")?,
            created_at: row.try_get("created_at")?,
            level: row.try_get("level")?,
            kind: row.try_get("type")?,
            message: row.try_get("message")?,
            data: parse_opt_json("data", row.try_get("data")?)?,
        })
    }
}

impl FtCheckpoint {
    fn from_row(row: &AnyRow) -> Result<Self> {
        let metrics: String = row.try_get("metrics")?;
        let result_files: String = row.try_get("result_files")?;
        Ok(Self {
            id: row.try_get("id")?,
            job_id: row.try_get("job_id")?,
            created_at: row.try_get("created_at")?,
            step_number: row.try_get("step_number")?,
            fine_tuned_model_checkpoint: row.try_get("fine_tuned_model_checkpoint")?,
            metrics: parse_json("metrics", &metrics)?,
            blob_prefix: row.try_get("blob_prefix")?,
            result_files: parse_id_list("result_files", &result_files)?,
        })
    }
}

/// Splits one extra row off a `LIMIT limit + 1` page: `(page, has_more)`.
fn page<T>(mut items: Vec<T>, limit: i64) -> (Vec<T>, bool) {
    let limit = limit.max(0) as usize;
    let has_more = items.len() > limit;
    items.truncate(limit);
    (items, has_more)
}

/// Which rows a newest-first page lists: `columns` of `table` whose
/// `owner_column` is `owner`.
struct PageOf<'a> {
    columns: &'a str,
    table: &'a str,
    owner_column: &'a str,
    owner: &'a str,
}

impl Store {
    /// A page of rows, newest (largest id) first: at most `limit`, with ids
    /// before `after` when given; returns the page and whether more follow.
    async fn newest_first<T>(
        &self,
        of: PageOf<'_>,
        limit: i64,
        after: Option<&str>,
        from_row: fn(&AnyRow) -> Result<T>,
    ) -> Result<(Vec<T>, bool)> {
        let PageOf {
            columns,
            table,
            owner_column,
            owner,
        } = of;
        let sql = match after {
            Some(_) => format!(
                "SELECT {columns} FROM {table} \
                 WHERE {owner_column} = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
            ),
            None => format!(
                "SELECT {columns} FROM {table} \
                 WHERE {owner_column} = $1 ORDER BY id DESC LIMIT $2"
            ),
        };
        let mut query = sqlx::query(&sql).bind(owner);
        if let Some(after) = after {
            query = query.bind(after);
        }
        let rows = query.bind(limit.max(0) + 1).fetch_all(&self.pool).await?;
        let items = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        Ok(page(items, limit))
    }
    /// Creates a job, `queued`, and its first event ("Created fine-tuning
    /// job"). The caller has checked everything (model, files, values).
    pub async fn create_ft_job(&self, new: NewFtJob) -> Result<FtJob> {
        let job = FtJob {
            id: new_id(ids::FT_JOB),
            project_id: new.project_id,
            model: new.model,
            training_file: new.training_file,
            validation_file: new.validation_file,
            suffix: new.suffix,
            seed: new.seed,
            hyperparameters: new.hyperparameters,
            method: new.method,
            status: FtStatus::Queued,
            fine_tuned_model: None,
            trained_tokens: None,
            trained_steps: 0,
            total_steps: None,
            result_files: Vec::new(),
            error: None,
            created_at: now(),
            finished_at: None,
            claimed_by: None,
            heartbeat_at: None,
            attempts: 0,
            metadata: new.metadata,
        };
        sqlx::query(
            "INSERT INTO fine_tuning_jobs (id, project_id, model, training_file, \
             validation_file, suffix, seed, hyperparameters, method, status, trained_steps, \
             result_files, created_at, metadata) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(&job.id)
        .bind(&job.project_id)
        .bind(&job.model)
        .bind(&job.training_file)
        .bind(job.validation_file.clone())
        .bind(job.suffix.clone())
        .bind(job.seed)
        .bind(job.hyperparameters.to_string())
        .bind(&job.method)
        .bind(job.status.as_str())
        .bind(job.trained_steps)
        .bind("[]")
        .bind(job.created_at)
        .bind(job.metadata.as_ref().map(Value::to_string))
        .execute(&self.pool)
        .await?;
        self.add_ft_event(&job.id, "info", "message", "Created fine-tuning job", None)
            .await?;
        Ok(job)
    }

    /// The job `id` of `project_id`; [`StoreError::NotFound`] when it does
    /// not exist or belongs to another project (the two look the same).
    pub async fn ft_job(&self, project_id: &str, id: &str) -> Result<FtJob> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM fine_tuning_jobs WHERE project_id = $1 AND id = $2"
        ))
        .bind(project_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => FtJob::from_row(&row),
            None => Err(StoreError::NotFound("fine-tuning job")),
        }
    }

    /// The job `id` whatever its project (for the worker).
    pub async fn ft_job_by_id(&self, id: &str) -> Result<FtJob> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM fine_tuning_jobs WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => FtJob::from_row(&row),
            None => Err(StoreError::NotFound("fine-tuning job")),
        }
    }

    /// A page of the project's jobs, newest first: at most `limit`, created
    /// before the job `after` when given. Returns the page and whether more
    /// follow.
    pub async fn list_ft_jobs(
        &self,
        project_id: &str,
        limit: i64,
        after: Option<&str>,
    ) -> Result<(Vec<FtJob>, bool)> {
        let of = PageOf {
            columns: JOB_COLUMNS,
            table: "fine_tuning_jobs",
            owner_column: "project_id",
            owner: project_id,
        };
        self.newest_first(of, limit, after, FtJob::from_row).await
    }

    /// As [`Store::list_ft_jobs`], only the jobs whose metadata holds
    /// every `(key, value)` pair of `metadata` (all of them; no pairs: every
    /// job). Metadata is JSON text, so the pairs are matched here rather
    /// than in SQL (the same on SQLite and PostgreSQL): the project's jobs
    /// are read newest first, a batch at a time, until the page is full.
    pub async fn list_ft_jobs_with_metadata(
        &self,
        project_id: &str,
        limit: i64,
        after: Option<&str>,
        metadata: &[(String, String)],
    ) -> Result<(Vec<FtJob>, bool)> {
        if metadata.is_empty() {
            return self.list_ft_jobs(project_id, limit, after).await;
        }
        const SCAN: i64 = 256;
        let wanted = limit.max(0) as usize + 1;
        let matches = |job: &FtJob| {
            metadata.iter().all(|(key, value)| {
                job.metadata
                    .as_ref()
                    .and_then(|m| m.get(key))
                    .and_then(Value::as_str)
                    == Some(value.as_str())
            })
        };
        let mut found = Vec::new();
        let mut cursor = after.map(str::to_string);
        loop {
            let of = PageOf {
                columns: JOB_COLUMNS,
                table: "fine_tuning_jobs",
                owner_column: "project_id",
                owner: project_id,
            };
            let (jobs, more) = self
                .newest_first(of, SCAN, cursor.as_deref(), FtJob::from_row)
                .await?;
            cursor = jobs.last().map(|j| j.id.clone());
            found.extend(jobs.into_iter().filter(|j| matches(j)));
            if found.len() >= wanted || !more {
                return Ok(page(found, limit));
            }
        }
    }

    /// Cancels the job at once: a `validating_files`, `queued` or `running`
    /// job becomes `cancelled` with `finished_at` set and a "Fine-tuning job
    /// cancelled" event (its worker learns it at its next heartbeat). A job
    /// already cancelled is returned as it is. A `succeeded` or `failed` job
    /// cannot be cancelled: [`StoreError::Invalid`] ("cannot cancel a job
    /// that has already succeeded"); the API answers it 400 shape B.
    /// [`StoreError::NotFound`] for a missing job or one of another project.
    pub async fn cancel_ft_job(&self, project_id: &str, id: &str) -> Result<FtJob> {
        let done = sqlx::query(&format!(
            "UPDATE fine_tuning_jobs SET status = 'cancelled', finished_at = $1 \
             WHERE project_id = $2 AND id = $3 AND status IN {ACTIVE}"
        ))
        .bind(now())
        .bind(project_id)
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            self.add_ft_event(id, "info", "message", "Fine-tuning job cancelled", None)
                .await?;
        }
        let job = self.ft_job(project_id, id).await?;
        match job.status {
            FtStatus::Cancelled => Ok(job),
            FtStatus::Succeeded | FtStatus::Failed => Err(StoreError::Invalid(format!(
                "cannot cancel a job that has already {}",
                job.status
            ))),
            // Not reachable: the update above applies to every active job.
            _ => Err(StoreError::Invalid(format!(
                "the job is {} and could not be cancelled, try again",
                job.status
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for status in FtStatus::ALL {
            assert_eq!(FtStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(FtStatus::parse("done"), None);
        assert!(FtStatus::Cancelled.is_terminal() && !FtStatus::Running.is_terminal());
    }
}
