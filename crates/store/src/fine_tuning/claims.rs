//! How workers take, keep and end fine-tuning jobs.
//!
//! A job is `running` under one worker (`claimed_by`) at a time. Every write
//! a worker makes to a job's state checks that it still holds the claim, so
//! a worker that lost its job (cancelled, or taken over after a stale
//! heartbeat) cannot overwrite what the new holder writes: it learns that it
//! lost the job from the `false` these calls return, and stops.
//!
//! Each claim counts an attempt (`attempts`). A job claimed again after its
//! worker died (crash, kill, power loss) is a new attempt; one that would go
//! past [`ClaimRules::max_attempts`] is failed instead of run, so a job
//! that crashes its process every time does not crash it forever.

use super::records::insert_event;
use super::*;

/// What a worker may claim.
#[derive(Debug, Clone)]
pub struct ClaimRules<'a> {
    /// The worker's name (`claimed_by`).
    pub worker: &'a str,
    /// A `running` job whose heartbeat is older than this many seconds is
    /// taken over (its worker died).
    pub stale_after_secs: i64,
    /// Only jobs for these base models (those this node serves); `None`:
    /// any.
    pub models: Option<&'a [String]>,
    /// Jobs this worker is running right now, in this process: never
    /// claimed again. Its other `running` jobs (from before a restart) are
    /// taken back at once.
    pub running_here: &'a [String],
    /// Claims a job may have; the one past it fails the job.
    pub max_attempts: i64,
}

/// Default of [`ClaimRules::max_attempts`].
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;

impl<'a> ClaimRules<'a> {
    /// Any model, nothing running here, [`DEFAULT_MAX_ATTEMPTS`].
    pub fn new(worker: &'a str, stale_after_secs: i64) -> Self {
        Self {
            worker,
            stale_after_secs,
            models: None,
            running_here: &[],
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// The condition a claimable job meets (`$1` = stale-before time, `$2` =
/// the worker).
const CLAIMABLE: &str = "(status = 'queued' OR (status = 'running' AND \
     (heartbeat_at IS NULL OR heartbeat_at < $1 OR claimed_by = $2)))";

impl Store {
    /// Takes a job for `rules.worker`: the oldest (by id) of the `queued`
    /// jobs, the `running` jobs whose heartbeat is stale (their worker
    /// died), and the worker's own `running` jobs from before a restart
    /// (not those in `running_here`); only for `rules.models`. The job
    /// becomes `running` with `claimed_by = worker`, `heartbeat_at = now`
    /// and one more attempt. A job past `max_attempts` is failed (with an
    /// error event) and the next candidate is looked at.
    ///
    /// Atomic between workers and processes: each candidate is taken with a
    /// conditional `UPDATE` that repeats the candidate condition, and a
    /// candidate another worker took first (no row updated) is skipped for
    /// the next one. `None` when nothing is claimable.
    pub async fn claim_ft_job(&self, rules: &ClaimRules<'_>) -> Result<Option<FtJob>> {
        if rules.models.is_some_and(|m| m.is_empty()) {
            return Ok(None);
        }
        let mut passed: Vec<String> = Vec::new();
        loop {
            let stale_before = now() - rules.stale_after_secs;
            let rows = sqlx::query(&format!(
                "SELECT id, model FROM fine_tuning_jobs WHERE {CLAIMABLE} ORDER BY id ASC LIMIT 64"
            ))
            .bind(stale_before)
            .bind(rules.worker)
            .fetch_all(&self.pool)
            .await?;
            let mut candidates = Vec::new();
            for row in &rows {
                let id: String = row.try_get("id")?;
                let model: String = row.try_get("model")?;
                let serves = rules.models.is_none_or(|m| m.contains(&model));
                if serves && !rules.running_here.contains(&id) && !passed.contains(&id) {
                    candidates.push(id);
                }
            }
            if candidates.is_empty() {
                return Ok(None);
            }
            for id in &candidates {
                let done = sqlx::query(&format!(
                    "UPDATE fine_tuning_jobs SET status = 'running', claimed_by = $2, \
                     heartbeat_at = $3, attempts = attempts + 1 WHERE id = $4 AND {CLAIMABLE}"
                ))
                .bind(stale_before)
                .bind(rules.worker)
                .bind(now())
                .bind(id)
                .execute(&self.pool)
                .await?;
                if done.rows_affected() != 1 {
                    continue; // another worker was first
                }
                let job = self.ft_job_by_id(id).await?;
                if job.attempts <= rules.max_attempts.max(1) {
                    return Ok(Some(job));
                }
                self.give_up_ft_job(&job, rules).await?;
                passed.push(job.id);
            }
            // Every candidate was lost to another worker or given up: look
            // again.
        }
    }

    /// Fails a job claimed past its attempts.
    async fn give_up_ft_job(&self, job: &FtJob, rules: &ClaimRules<'_>) -> Result<()> {
        let tries = job.attempts - 1;
        let message = format!(
            "the job stopped its worker {tries} times without finishing (the process \
             crashed or was killed); not trying again after {tries} attempts"
        );
        let error = serde_json::json!({
            "code": "too_many_attempts",
            "message": message,
            "param": null,
        });
        if self
            .finish_ft_job(
                &job.id,
                rules.worker,
                FtStatus::Failed,
                None,
                &[],
                Some(error),
            )
            .await?
        {
            self.add_ft_event(
                &job.id,
                "error",
                "message",
                &format!("Training failed: {message}"),
                None,
            )
            .await?;
        }
        Ok(())
    }

    /// Records that `worker` is still running the job. Returns false when the
    /// job is no longer `running` under `worker` (cancelled, finished, or
    /// reclaimed by another worker after a stale heartbeat): the worker
    /// must stop.
    pub async fn heartbeat_ft_job(&self, id: &str, worker: &str) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        hold_ft_job(&mut conn, id, worker).await
    }

    /// Gives a job `running` under `worker` back to the queue, as if this
    /// claim had not happened (the attempt does not count): its server is
    /// shutting down in good order, and any node may take it and resume it
    /// from its latest checkpoint. Returns whether it applied.
    pub async fn release_ft_job(&self, id: &str, worker: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE fine_tuning_jobs SET status = 'queued', claimed_by = NULL, \
             heartbeat_at = NULL, attempts = attempts - 1 \
             WHERE id = $1 AND status = 'running' AND claimed_by = $2",
        )
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Sets the job's progress (`trained_steps`, `trained_tokens`,
    /// `total_steps`) while the job is `running` under `worker`. Returns
    /// whether it applied: false when the job is gone, cancelled, finished,
    /// or claimed by another worker. A cancelled job keeps the progress it
    /// had when it was cancelled: a step that ends after the cancel is not
    /// counted.
    pub async fn update_ft_progress(
        &self,
        id: &str,
        worker: &str,
        trained_steps: i64,
        trained_tokens: i64,
        total_steps: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE fine_tuning_jobs SET trained_steps = $1, trained_tokens = $2, \
             total_steps = $3 WHERE id = $4 AND claimed_by = $5 AND status = 'running'",
        )
        .bind(trained_steps)
        .bind(trained_tokens)
        .bind(total_steps)
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Appends an event to the job's log only while the job is `running`
    /// under `worker` (see [`Store::add_ft_event`]); returns whether it
    /// was written. The job's row is held for the write, so a cancel that
    /// comes at the same time is either before it (no event) or after it.
    pub async fn add_held_ft_event(
        &self,
        job_id: &str,
        worker: &str,
        level: &str,
        kind: &str,
        message: &str,
        data: Option<Value>,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        if !hold_ft_job(&mut tx, job_id, worker).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        let event = FtEvent::new(job_id, level, kind, message, data);
        insert_event(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Ends a job `running` under `worker` with `status` (`succeeded` or
    /// `failed`), the fine-tuned model's name, the result files and the
    /// error (`{code, message, param}`), and sets `finished_at`. Applies
    /// only while the job is `running` under `worker` (a cancelled job
    /// stays cancelled, a job taken over is the new holder's to end);
    /// returns whether it applied. A non-terminal `status` is
    /// [`StoreError::Invalid`].
    pub async fn finish_ft_job(
        &self,
        id: &str,
        worker: &str,
        status: FtStatus,
        fine_tuned_model: Option<&str>,
        result_files: &[String],
        error: Option<Value>,
    ) -> Result<bool> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid(format!(
                "a job cannot finish as `{status}`"
            )));
        }
        let result_files =
            serde_json::to_string(result_files).expect("a list of strings serialises");
        let done = sqlx::query(
            "UPDATE fine_tuning_jobs SET status = $1, fine_tuned_model = $2, \
             result_files = $3, error = $4, finished_at = $5 \
             WHERE id = $6 AND status = 'running' AND claimed_by = $7",
        )
        .bind(status.as_str())
        .bind(fine_tuned_model.map(str::to_string))
        .bind(result_files)
        .bind(error.map(|e| e.to_string()))
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// Renews the claim of the job `running` under `worker` on `conn` (a
/// transaction): the row stays locked until the transaction ends, so a
/// cancel waits for it. Returns whether the worker still holds the job.
pub(super) async fn hold_ft_job(
    conn: &mut sqlx::AnyConnection,
    id: &str,
    worker: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE fine_tuning_jobs SET heartbeat_at = $1 \
         WHERE id = $2 AND status = 'running' AND claimed_by = $3",
    )
    .bind(now())
    .bind(id)
    .bind(worker)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
