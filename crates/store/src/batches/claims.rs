//! How workers take, keep and end batches, and the results they record.
//!
//! A batch not yet over is held by one worker (`claimed_by`) at a time.
//! Every write a worker makes to a batch checks that it still holds the
//! claim, so a worker that lost its batch (taken over after a stale
//! heartbeat) cannot overwrite what the new holder writes: it learns that
//! it lost the batch from the `false` (or `None`) these calls return, and
//! stops.
//!
//! Each claim counts an attempt (`attempts`). A batch claimed again after
//! its worker died (crash, kill, power loss) is a new attempt; one that
//! would go past [`BatchClaimRules::max_attempts`] is failed instead of run,
//! so a batch that crashes its process every time does not crash it
//! forever.
//!
//! Results are written with the counters they move in one transaction, and
//! a line is recorded once: a worker resuming a batch may run a line again
//! (its result was lost with the process) without counting it twice.

use super::*;

/// What a worker may claim.
#[derive(Debug, Clone)]
pub struct BatchClaimRules<'a> {
    /// The worker's name (`claimed_by`).
    pub worker: &'a str,
    /// A batch whose heartbeat is older than this many seconds is taken
    /// over (its worker died).
    pub stale_after_secs: i64,
    /// Batches this worker is running right now, in this process: never
    /// claimed again. Its other batches (from before a restart) are taken
    /// back at once.
    pub running_here: &'a [String],
    /// Claims a batch may have; the one past it fails the batch.
    pub max_attempts: i64,
}

impl<'a> BatchClaimRules<'a> {
    /// Nothing running here,
    /// [`DEFAULT_MAX_ATTEMPTS`](crate::fine_tuning::DEFAULT_MAX_ATTEMPTS).
    pub fn new(worker: &'a str, stale_after_secs: i64) -> Self {
        Self {
            worker,
            stale_after_secs,
            running_here: &[],
            max_attempts: crate::fine_tuning::DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// The condition a claimable batch meets (`$1` = stale-before time, `$2` =
/// the worker).
const CLAIMABLE: &str = "(status IN ('validating', 'in_progress', 'finalizing', 'cancelling') \
     AND (claimed_by IS NULL OR heartbeat_at IS NULL OR heartbeat_at < $1 OR claimed_by = $2))";

/// The statuses a batch records results in.
const RECORDING: &str = "('in_progress', 'finalizing', 'cancelling')";

impl Store {
    /// Takes a batch for `rules.worker`: the oldest (by id) of the batches
    /// not yet over that no worker holds, whose worker's heartbeat is stale
    /// (it died), or that the worker itself held before a restart (not
    /// those in `running_here`). The batch keeps its status and gets
    /// `claimed_by = worker`, `heartbeat_at = now` and one more attempt. A
    /// batch past `max_attempts` is failed (`too_many_attempts`) and the
    /// next candidate is looked at.
    ///
    /// Atomic between workers and processes: each candidate is taken with a
    /// conditional `UPDATE` that repeats the candidate condition, and a
    /// candidate another worker took first (no row updated) is skipped for
    /// the next one. `None` when nothing is claimable.
    pub async fn claim_batch(&self, rules: &BatchClaimRules<'_>) -> Result<Option<Batch>> {
        let mut passed: Vec<String> = Vec::new();
        loop {
            let stale_before = now() - rules.stale_after_secs;
            let rows = sqlx::query(&format!(
                "SELECT id FROM batches WHERE {CLAIMABLE} ORDER BY id ASC LIMIT 64"
            ))
            .bind(stale_before)
            .bind(rules.worker)
            .fetch_all(&self.pool)
            .await?;
            let mut candidates = Vec::new();
            for row in &rows {
                let id: String = row.try_get("id")?;
                if !rules.running_here.contains(&id) && !passed.contains(&id) {
                    candidates.push(id);
                }
            }
            if candidates.is_empty() {
                return Ok(None);
            }
            for id in &candidates {
                let done = sqlx::query(&format!(
                    "UPDATE batches SET claimed_by = $2, heartbeat_at = $3, \
                     attempts = attempts + 1 WHERE id = $4 AND {CLAIMABLE}"
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
                let batch = self.batch_by_id(id).await?;
                if batch.attempts <= rules.max_attempts.max(1) {
                    return Ok(Some(batch));
                }
                self.give_up_batch(&batch, rules.worker).await?;
                passed.push(batch.id);
            }
            // Every candidate was lost to another worker or given up: look
            // again.
        }
    }

    /// Fails a batch claimed past its attempts, whatever its status.
    async fn give_up_batch(&self, batch: &Batch, worker: &str) -> Result<bool> {
        let tries = batch.attempts - 1;
        let errors = serde_json::json!([{
            "code": "too_many_attempts",
            "message": format!(
                "the batch stopped its worker {tries} times without finishing (the process \
                 crashed or was killed); not trying again after {tries} attempts"
            ),
            "param": null,
            "line": null,
        }]);
        self.end_failed(&batch.id, worker, ACTIVE, errors).await
    }

    /// Renews the claim's heartbeat. Returns the batch's status while
    /// `worker` holds it (`cancelling`: the worker stops its requests and
    /// ends the batch), `None` when it does not (taken over after a stale
    /// heartbeat, ended, or gone): the worker must stop.
    pub async fn heartbeat_batch(&self, id: &str, worker: &str) -> Result<Option<BatchStatus>> {
        let done = sqlx::query(&format!(
            "UPDATE batches SET heartbeat_at = $1 \
             WHERE id = $2 AND claimed_by = $3 AND status IN {ACTIVE}"
        ))
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let row = sqlx::query("SELECT status FROM batches WHERE id = $1 AND claimed_by = $2")
            .bind(id)
            .bind(worker)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let status: String = row.try_get("status")?;
        BatchStatus::parse(&status).map(Some).ok_or_else(|| {
            StoreError::Invalid(format!("stored batch status `{status}` is unknown"))
        })
    }

    /// Gives a batch held by `worker` back, as if this claim had not
    /// happened (the attempt does not count; the status stays): its server
    /// is shutting down in good order, and any node may take it and run the
    /// lines without a result. Returns whether it applied.
    pub async fn release_batch(&self, id: &str, worker: &str) -> Result<bool> {
        let done = sqlx::query(&format!(
            "UPDATE batches SET claimed_by = NULL, heartbeat_at = NULL, \
             attempts = attempts - 1 WHERE id = $1 AND claimed_by = $2 AND status IN {ACTIVE}"
        ))
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `validating` -> `in_progress` once the input file passed: sets the
    /// batch's `model`, its number of requests (`total`) and
    /// `in_progress_at`. Returns whether it applied (false: not `worker`'s,
    /// or no longer `validating`, e.g. cancelled meanwhile).
    pub async fn start_batch(
        &self,
        id: &str,
        worker: &str,
        model: &str,
        total: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE batches SET status = 'in_progress', model = $1, total = $2, \
             in_progress_at = $3 WHERE id = $4 AND claimed_by = $5 AND status = 'validating'",
        )
        .bind(model)
        .bind(total)
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `validating` or `in_progress` -> `failed` with `errors` (a JSON list
    /// of `{code, message, param, line}`): sets `failed_at`, clears the
    /// claim and drops any recorded results (a failed batch writes no
    /// files). Returns whether it applied.
    pub async fn fail_batch(&self, id: &str, worker: &str, errors: Value) -> Result<bool> {
        self.end_failed(id, worker, "('validating', 'in_progress')", errors)
            .await
    }

    /// Ends a batch held by `worker` whose status is in `from` (an SQL
    /// list) as `failed`, and drops its results, in one transaction.
    async fn end_failed(&self, id: &str, worker: &str, from: &str, errors: Value) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(&format!(
            "UPDATE batches SET status = 'failed', errors = $1, failed_at = $2, \
             claimed_by = NULL, heartbeat_at = NULL \
             WHERE id = $3 AND claimed_by = $4 AND status IN {from}"
        ))
        .bind(errors.to_string())
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("DELETE FROM batch_results WHERE batch_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records one request's result and counts it (`completed` + 1 when
    /// `ok`, `failed` + 1 otherwise), in one transaction, while `worker`
    /// holds the batch and it is `in_progress`, `finalizing` or
    /// `cancelling`; false otherwise (nothing written). A line already
    /// recorded is neither recorded nor counted again, and answers true: a
    /// resumed batch may run a line twice.
    pub async fn add_batch_result(
        &self,
        id: &str,
        worker: &str,
        result: &BatchResult,
    ) -> Result<bool> {
        let counter = if result.ok { "completed" } else { "failed" };
        // The UPDATE first: it takes SQLite's write lock at once, and checks
        // the claim before anything is written.
        let mut tx = self.pool.begin().await?;
        let counted = sqlx::query(&format!(
            "UPDATE batches SET {counter} = {counter} + 1 \
             WHERE id = $1 AND claimed_by = $2 AND status IN {RECORDING}"
        ))
        .bind(id)
        .bind(worker)
        .execute(&mut *tx)
        .await?;
        if counted.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let recorded = sqlx::query(
            "INSERT INTO batch_results (batch_id, line, ok, body) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (batch_id, line) DO NOTHING",
        )
        .bind(id)
        .bind(result.line)
        .bind(i64::from(result.ok))
        .bind(&result.body)
        .execute(&mut *tx)
        .await?;
        if recorded.rows_affected() != 1 {
            // Already recorded: the counters stay as they were.
            tx.rollback().await?;
            return Ok(true);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The lines with a recorded result, ascending (those a resumed batch
    /// does not run again).
    pub async fn batch_result_lines(&self, id: &str) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT line FROM batch_results WHERE batch_id = $1 ORDER BY line")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<i64, _>("line")?))
            .collect()
    }

    /// Recorded results in line order: those after `after_line` (-1 for the
    /// start), at most `limit`. The worker pages through them to write the
    /// result files.
    pub async fn batch_results(
        &self,
        id: &str,
        after_line: i64,
        limit: i64,
    ) -> Result<Vec<BatchResult>> {
        let rows = sqlx::query(
            "SELECT line, ok, body FROM batch_results WHERE batch_id = $1 AND line > $2 \
             ORDER BY line LIMIT $3",
        )
        .bind(id)
        .bind(after_line)
        .bind(limit.max(0))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(BatchResult::from_row).collect()
    }

    /// `in_progress` -> `finalizing` (`finalizing_at`) once every request
    /// has a result: the worker writes the result files next. A batch
    /// already `finalizing` under `worker` (resumed there) stays so and
    /// answers true; a `cancelling` batch stays `cancelling` (false), as
    /// does one not `worker`'s.
    pub async fn finalize_batch(&self, id: &str, worker: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE batches SET status = 'finalizing', \
             finalizing_at = COALESCE(finalizing_at, $1) \
             WHERE id = $2 AND claimed_by = $3 AND status IN ('in_progress', 'finalizing')",
        )
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Ends a batch held by `worker` as `status`, with the result files it
    /// wrote: `completed` (from `in_progress` or `finalizing`), `expired`
    /// (from `in_progress` or `finalizing`: the window ended first) or
    /// `cancelled` (from `cancelling`). Sets `completed_at`, `expired_at`
    /// or `cancelled_at`, clears the claim and drops the recorded results,
    /// in one transaction. Returns whether it applied; another `status` is
    /// [`StoreError::Invalid`].
    pub async fn finish_batch(
        &self,
        id: &str,
        worker: &str,
        status: BatchStatus,
        output_file_id: Option<&str>,
        error_file_id: Option<&str>,
    ) -> Result<bool> {
        let (at, from) = match status {
            BatchStatus::Completed => ("completed_at", "('in_progress', 'finalizing')"),
            BatchStatus::Expired => ("expired_at", "('in_progress', 'finalizing')"),
            BatchStatus::Cancelled => ("cancelled_at", "('cancelling')"),
            _ => {
                return Err(StoreError::Invalid(format!(
                    "a batch cannot finish as `{status}`"
                )))
            }
        };
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(&format!(
            "UPDATE batches SET status = $1, output_file_id = $2, error_file_id = $3, \
             {at} = $4, claimed_by = NULL, heartbeat_at = NULL \
             WHERE id = $5 AND claimed_by = $6 AND status IN {from}"
        ))
        .bind(status.as_str())
        .bind(output_file_id.map(str::to_string))
        .bind(error_file_id.map(str::to_string))
        .bind(now())
        .bind(id)
        .bind(worker)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("DELETE FROM batch_results WHERE batch_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
