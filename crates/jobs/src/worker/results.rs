//! What a job writes for others to use: each checkpoint (PEFT adapter and
//! training state in the blob store, the adapter also published as two
//! files of the job's project) and, on success, the metrics CSV.
//!
//! Files are committed with the row that lists them (the checkpoint row, or
//! the job's success) by `hearth_store`, so a job resumed after a crash
//! never leaves a published file unlisted or listed twice: what it had not
//! committed is written again with new files, and the blobs of the lost
//! attempt have no rows (the start-up sweep removes them).

use hearth_store::fine_tuning::FtJob;
use hearth_store::{NewCheckpoint, ResultFile};
use serde_json::json;

use super::{JobContext, Stop, ADAPTER_CONFIG, ADAPTER_WEIGHTS, TRAINING_STATE};
use crate::progress::{logged, metrics_csv, step_data};
use crate::{StepReport, Trainer};

/// The metrics CSV's file name.
pub const METRICS_CSV: &str = "step_metrics.csv";

impl JobContext {
    /// Saves a checkpoint: three blobs under `fine_tuning/<job>/step-<n>/`,
    /// then, while the job is still this worker's, its row together with
    /// the adapter's two published files.
    pub(super) fn checkpoint(
        &self,
        job: &FtJob,
        trainer: &Trainer,
        report: &StepReport,
        name: &str,
        trained_tokens: i64,
    ) -> Result<(), Stop> {
        let prefix = format!("fine_tuning/{}/step-{:06}", job.id, report.step);
        let (weights, config) = trainer.adapter()?.to_peft()?;
        let state = trainer.save_state()?;
        let blobs = self.store.blobs();
        // The state goes last, and each blob is on disk before the next
        // write: a checkpoint row is only written once all three are.
        self.block_on(blobs.put(&format!("{prefix}/{ADAPTER_WEIGHTS}"), &weights))?;
        self.block_on(blobs.put(&format!("{prefix}/{ADAPTER_CONFIG}"), config.as_bytes()))?;
        self.block_on(blobs.put(&format!("{prefix}/{TRAINING_STATE}"), &state))?;
        // Still ours? (A job taken over gets its checkpoints from its new
        // worker; a cancelled one gets none.)
        self.progress(&job.id, report.step, trained_tokens, trainer.total_steps())?;
        let mut metrics = step_data(report);
        metrics["trained_tokens"] = json!(trained_tokens);
        let published = [
            ResultFile {
                filename: ADAPTER_WEIGHTS,
                bytes: &weights,
            },
            ResultFile {
                filename: ADAPTER_CONFIG,
                bytes: config.as_bytes(),
            },
        ];
        let written = self.block_on(self.store.add_held_ft_checkpoint_with_files(
            &self.config.worker_id,
            NewCheckpoint {
                job_id: &job.id,
                project_id: &job.project_id,
                step_number: report.step as i64,
                fine_tuned_model_checkpoint: &format!("{name}:ckpt-step-{}", report.step),
                metrics,
                blob_prefix: &prefix,
                files: &published,
            },
        ))?;
        if written.is_none() {
            // Cancelled (or taken over) since the progress write.
            self.cancelled
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(Stop::Cancelled);
        }
        self.event(
            &job.id,
            "message",
            format!("Checkpoint saved at step {}", report.step),
            None,
        );
        Ok(())
    }

    /// Ends the job `succeeded` as `name` with its result files: the
    /// metrics CSV (published now, with the success) and the final
    /// adapter, which is the last checkpoint's (the last step always
    /// writes one) and already published. Returns whether it applied (not
    /// when the job was cancelled or taken over meanwhile).
    pub(super) fn publish_success(&self, job: &FtJob, name: &str) -> Result<bool, Stop> {
        let csv = metrics_csv(&self.block_on(logged(&self.store, &job.id))?.steps);
        let final_adapter = self
            .block_on(self.store.latest_ft_checkpoint(&job.id))?
            .map(|c| c.result_files)
            .unwrap_or_default();
        Ok(self.block_on(self.store.succeed_ft_job_with_files(
            &job.id,
            &self.config.worker_id,
            name,
            &[ResultFile {
                filename: METRICS_CSV,
                bytes: csv.as_bytes(),
            }],
            &final_adapter,
        ))?)
    }
}
