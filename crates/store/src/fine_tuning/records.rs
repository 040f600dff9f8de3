//! Events and checkpoints of fine-tuning jobs, the lookups of succeeded
//! jobs' models, and the files jobs write.

use super::*;

impl Store {
    /// Appends an event to the job's log. `kind` is the wire's `type`
    /// (`message` or `metrics`); `level` is `info`, `warn` or `error`.
    pub async fn add_ft_event(
        &self,
        job_id: &str,
        level: &str,
        kind: &str,
        message: &str,
        data: Option<Value>,
    ) -> Result<FtEvent> {
        let event = FtEvent::new(job_id, level, kind, message, data);
        let mut conn = self.pool.acquire().await?;
        insert_event(&mut conn, &event).await?;
        Ok(event)
    }

    /// A page of the job's events, newest first (as OpenAI lists them): at
    /// most `limit`, created before the event `after` when given.
    pub async fn list_ft_events(
        &self,
        job_id: &str,
        limit: i64,
        after: Option<&str>,
    ) -> Result<(Vec<FtEvent>, bool)> {
        let of = PageOf {
            columns: EVENT_COLUMNS,
            table: "fine_tuning_events",
            owner_column: "job_id",
            owner: job_id,
        };
        self.newest_first(of, limit, after, FtEvent::from_row).await
    }

    /// Records a checkpoint of the job (its blobs already written under
    /// `blob_prefix`), publishing no files. `metrics` should be a JSON
    /// object. (The worker publishes its adapters with
    /// [`Store::add_ft_checkpoint_with_files`].)
    pub async fn add_ft_checkpoint(
        &self,
        job_id: &str,
        step_number: i64,
        fine_tuned_model_checkpoint: &str,
        metrics: Value,
        blob_prefix: &str,
    ) -> Result<FtCheckpoint> {
        // With no files the project is never read.
        self.add_ft_checkpoint_with_files(NewCheckpoint {
            job_id,
            project_id: "",
            step_number,
            fine_tuned_model_checkpoint,
            metrics,
            blob_prefix,
            files: &[],
        })
        .await
    }

    /// A page of the job's checkpoints, newest first: at most `limit`,
    /// created before the checkpoint `after` when given.
    pub async fn list_ft_checkpoints(
        &self,
        job_id: &str,
        limit: i64,
        after: Option<&str>,
    ) -> Result<(Vec<FtCheckpoint>, bool)> {
        let of = PageOf {
            columns: CHECKPOINT_COLUMNS,
            table: "fine_tuning_checkpoints",
            owner_column: "job_id",
            owner: job_id,
        };
        self.newest_first(of, limit, after, FtCheckpoint::from_row)
            .await
    }

    /// The checkpoint `id` of the job; [`StoreError::NotFound`] otherwise.
    /// (The caller checks the job is the caller's project's.)
    pub async fn ft_checkpoint(&self, job_id: &str, id: &str) -> Result<FtCheckpoint> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM fine_tuning_checkpoints \
             WHERE job_id = $1 AND id = $2"
        ))
        .bind(job_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => FtCheckpoint::from_row(&row),
            None => Err(StoreError::NotFound("fine-tuning checkpoint")),
        }
    }

    /// The job's checkpoint with the highest step number (the newest among
    /// equals), if any.
    pub async fn latest_ft_checkpoint(&self, job_id: &str) -> Result<Option<FtCheckpoint>> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM fine_tuning_checkpoints \
             WHERE job_id = $1 ORDER BY step_number DESC, id DESC LIMIT 1"
        ))
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(FtCheckpoint::from_row).transpose()
    }

    /// The `succeeded` job of `project_id` whose `fine_tuned_model` is
    /// `fine_tuned_model` (the newest, should there be several), if any;
    /// none once the model was deleted ([`Store::delete_ft_model`]).
    pub async fn ft_job_by_model(
        &self,
        project_id: &str,
        fine_tuned_model: &str,
    ) -> Result<Option<FtJob>> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM fine_tuning_jobs WHERE project_id = $1 \
             AND fine_tuned_model = $2 AND status = 'succeeded' AND model_deleted_at IS NULL \
             ORDER BY id DESC LIMIT 1"
        ))
        .bind(project_id)
        .bind(fine_tuned_model)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(FtJob::from_row).transpose()
    }

    /// Every `succeeded` job of `project_id` whose model was not deleted,
    /// oldest first (the fine-tuned models `/v1/models` lists).
    pub async fn succeeded_ft_jobs(&self, project_id: &str) -> Result<Vec<FtJob>> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM fine_tuning_jobs WHERE project_id = $1 \
             AND status = 'succeeded' AND model_deleted_at IS NULL ORDER BY id ASC"
        ))
        .bind(project_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(FtJob::from_row).collect()
    }

    /// Deletes the fine-tuned model `fine_tuned_model` of `project_id`
    /// (a `succeeded` job's): from now on it is neither found by
    /// [`Store::ft_job_by_model`] nor listed by [`Store::succeeded_ft_jobs`];
    /// the job itself, its name in `fine_tuned_model`, its checkpoints and
    /// files stay. Returns whether there was such a model (false when it
    /// does not exist, is another project's, or was deleted already).
    pub async fn delete_ft_model(&self, project_id: &str, fine_tuned_model: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE fine_tuning_jobs SET model_deleted_at = $1 WHERE project_id = $2 \
             AND fine_tuned_model = $3 AND status = 'succeeded' AND model_deleted_at IS NULL",
        )
        .bind(now())
        .bind(project_id)
        .bind(fine_tuned_model)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Ids of the active (`validating_files`, `queued`, `running`) jobs that
    /// use `file_id` as training or validation file.
    pub(crate) async fn ft_jobs_using_file(&self, file_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(&format!(
            "SELECT id FROM fine_tuning_jobs WHERE (training_file = $1 OR validation_file = $1) \
             AND status IN {ACTIVE} ORDER BY id ASC"
        ))
        .bind(file_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("id")?))
            .collect()
    }

    /// Stores a file the server writes (a job's metrics CSV, purpose
    /// `fine-tune-results`): the blob first, then the row, as uploads do.
    /// Its status is `processed`.
    pub async fn create_file_from_bytes(
        &self,
        project_id: &str,
        filename: &str,
        purpose: &str,
        bytes: &[u8],
    ) -> Result<FileRecord> {
        let id = new_id(ids::FILE);
        self.blobs.put(&format!("files/{id}"), bytes).await?;
        let record = FileRecord {
            id,
            project_id: project_id.to_string(),
            filename: filename.to_string(),
            purpose: purpose.to_string(),
            bytes: bytes.len() as i64,
            status: crate::files::FileStatus::Processed.as_str().to_string(),
            status_details: None,
            created_at: now(),
        };
        if let Err(e) = self.insert_file(&record).await {
            let _ = self.blobs.delete(&record.id).await;
            return Err(e);
        }
        Ok(record)
    }
}

/// Inserts a checkpoint row on `conn` (a pooled connection or a
/// transaction).
pub(super) async fn insert_checkpoint(
    conn: &mut sqlx::AnyConnection,
    checkpoint: &FtCheckpoint,
) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO fine_tuning_checkpoints ({CHECKPOINT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    ))
    .bind(&checkpoint.id)
    .bind(&checkpoint.job_id)
    .bind(checkpoint.created_at)
    .bind(checkpoint.step_number)
    .bind(&checkpoint.fine_tuned_model_checkpoint)
    .bind(checkpoint.metrics.to_string())
    .bind(&checkpoint.blob_prefix)
    .bind(serde_json::to_string(&checkpoint.result_files).expect("a list of strings serialises"))
    .execute(conn)
    .await?;
    Ok(())
}

/// Inserts an event row on `conn` (a pooled connection or a transaction).
pub(super) async fn insert_event(conn: &mut sqlx::AnyConnection, event: &FtEvent) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO fine_tuning_events ({EVENT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    ))
    .bind(&event.id)
    .bind(&event.job_id)
    .bind(event.created_at)
    .bind(&event.level)
    .bind(&event.kind)
    .bind(&event.message)
    .bind(event.data.as_ref().map(Value::to_string))
    .execute(conn)
    .await?;
    Ok(())
}
