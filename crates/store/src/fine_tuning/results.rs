//! The files a fine-tuning job publishes: each checkpoint's PEFT adapter
//! and, at the end, the metrics CSV, as files of the job's project (purpose
//! `fine-tune-results`) that download through the Files API.
//!
//! Publishing is idempotent across crashes: the blobs (`files/<id>`) are
//! written first, then the file rows commit in one transaction with what
//! lists them (the checkpoint row, or the job's success). A crash before
//! the commit leaves only blobs without rows, which the start-up sweep
//! removes; a job resumed after it writes that checkpoint (or its end)
//! again with new files, so no file row is ever left unlisted or listed
//! twice.

use super::claims::hold_ft_job;
use super::records::insert_checkpoint;
use super::*;
use crate::files::{insert_file_on, FileStatus};

/// The purpose of the files a job writes.
pub const RESULTS_PURPOSE: &str = "fine-tune-results";

/// A file to publish: its name and content.
#[derive(Debug, Clone, Copy)]
pub struct ResultFile<'a> {
    pub filename: &'a str,
    pub bytes: &'a [u8],
}

/// A checkpoint to record: its job, the job's project (that of the
/// published `files`), the step, the model name it serves as, its
/// metrics, and where its own blobs were written.
#[derive(Debug, Clone)]
pub struct NewCheckpoint<'a> {
    pub job_id: &'a str,
    pub project_id: &'a str,
    pub step_number: i64,
    pub fine_tuned_model_checkpoint: &'a str,
    pub metrics: Value,
    pub blob_prefix: &'a str,
    pub files: &'a [ResultFile<'a>],
}

impl Store {
    /// Writes the blobs of `files` (new file ids, project `project_id`,
    /// purpose [`RESULTS_PURPOSE`]) and returns their rows, not yet
    /// inserted.
    async fn put_result_blobs(
        &self,
        project_id: &str,
        files: &[ResultFile<'_>],
    ) -> Result<Vec<FileRecord>> {
        let mut records = Vec::with_capacity(files.len());
        for f in files {
            let id = new_id(ids::FILE);
            self.blobs.put(&format!("files/{id}"), f.bytes).await?;
            records.push(FileRecord {
                id,
                project_id: project_id.to_string(),
                filename: f.filename.to_string(),
                purpose: RESULTS_PURPOSE.to_string(),
                bytes: f.bytes.len() as i64,
                status: FileStatus::Processed.as_str().to_string(),
                status_details: None,
                created_at: now(),
            });
        }
        Ok(records)
    }

    /// Removes the blobs of rows that were never committed.
    async fn drop_result_blobs(&self, records: &[FileRecord]) {
        for r in records {
            if let Err(e) = self.blobs.delete(&r.id).await {
                tracing::warn!(file = %r.id, error = %e, "cannot remove an unused result blob");
            }
        }
    }

    /// Records a checkpoint of the job (its own blobs already written under
    /// `blob_prefix`) and publishes `files` as files of `project_id` (the
    /// job's), listed in the checkpoint's `result_files` in the order
    /// given: the file rows and the checkpoint row commit together.
    pub async fn add_ft_checkpoint_with_files(
        &self,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<FtCheckpoint> {
        // Without a claim to check, a checkpoint is written or an error.
        self.insert_ft_checkpoint(None, checkpoint)
            .await?
            .ok_or_else(|| StoreError::Invalid("the checkpoint was not written".into()))
    }

    /// As [`Store::add_ft_checkpoint_with_files`], only while the job is
    /// `running` under `worker` (the row held for the commit, so a cancel
    /// is either before it or after it): `None`, with nothing written, when
    /// the job was cancelled, finished or taken over.
    pub async fn add_held_ft_checkpoint_with_files(
        &self,
        worker: &str,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<Option<FtCheckpoint>> {
        self.insert_ft_checkpoint(Some(worker), checkpoint).await
    }

    /// The checkpoint row and its file rows in one transaction, first
    /// checking that `held_by` (when given) still holds the job.
    async fn insert_ft_checkpoint(
        &self,
        held_by: Option<&str>,
        new: NewCheckpoint<'_>,
    ) -> Result<Option<FtCheckpoint>> {
        let NewCheckpoint {
            job_id,
            project_id,
            step_number,
            fine_tuned_model_checkpoint,
            metrics,
            blob_prefix,
            files,
        } = new;
        let records = self.put_result_blobs(project_id, files).await?;
        let checkpoint = FtCheckpoint {
            id: new_id(ids::FT_CHECKPOINT),
            job_id: job_id.to_string(),
            created_at: now(),
            step_number,
            fine_tuned_model_checkpoint: fine_tuned_model_checkpoint.to_string(),
            metrics,
            blob_prefix: blob_prefix.to_string(),
            result_files: records.iter().map(|r| r.id.clone()).collect(),
        };
        let committed = async {
            let mut tx = self.pool.begin().await?;
            if let Some(worker) = held_by {
                if !hold_ft_job(&mut tx, job_id, worker).await? {
                    tx.rollback().await?;
                    return Ok(false);
                }
            }
            for r in &records {
                insert_file_on(&mut tx, r).await?;
            }
            insert_checkpoint(&mut tx, &checkpoint).await?;
            tx.commit().await?;
            Ok::<_, StoreError>(true)
        }
        .await;
        match committed {
            Ok(true) => Ok(Some(checkpoint)),
            other => {
                self.drop_result_blobs(&records).await;
                other.map(|_| None)
            }
        }
    }

    /// Ends the job `succeeded` as `fine_tuned_model`, only while it is
    /// `running` under `worker` (as [`Store::finish_ft_job`]), publishing
    /// `files` (the metrics CSV) in the same transaction. The job's
    /// `result_files` are the new files' ids followed by `also` (files
    /// already published, e.g. the final checkpoint's adapter). Returns
    /// whether it applied; when it did not, nothing is published.
    pub async fn succeed_ft_job_with_files(
        &self,
        id: &str,
        worker: &str,
        fine_tuned_model: &str,
        files: &[ResultFile<'_>],
        also: &[String],
    ) -> Result<bool> {
        let job = self.ft_job_by_id(id).await?;
        let records = self.put_result_blobs(&job.project_id, files).await?;
        let mut result_files: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        result_files.extend(also.iter().cloned());
        let committed = async {
            let mut tx = self.pool.begin().await?;
            let done = sqlx::query(
                "UPDATE fine_tuning_jobs SET status = 'succeeded', fine_tuned_model = $1, \
                 result_files = $2, error = NULL, finished_at = $3 \
                 WHERE id = $4 AND status = 'running' AND claimed_by = $5",
            )
            .bind(fine_tuned_model)
            .bind(serde_json::to_string(&result_files).expect("a list of strings serialises"))
            .bind(now())
            .bind(id)
            .bind(worker)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            for r in &records {
                insert_file_on(&mut tx, r).await?;
            }
            tx.commit().await?;
            Ok::<_, StoreError>(true)
        }
        .await;
        match committed {
            Ok(true) => Ok(true),
            other => {
                self.drop_result_blobs(&records).await;
                other
            }
        }
    }
}
