//! Multipart dataset uploads: an upload is created `PENDING` with the
//! dataset's name, folder and schema; each part arrives checked and already
//! stored as Parquet ([`Store::add_upload_part`]); completing it with a list
//! of its parts creates the dataset over those parts in one transaction
//! (`COMPLETED`, idempotent for the same list); cancelling it ends it
//! `CANCELLED`. Parts of uploads that end without them (cancelled, expired,
//! or left out of the completing list) are for the caller to delete: the
//! functions return their blob keys.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::records::{insert_dataset, stored_schema, Dataset, NewDataset, StoredPart};
use super::schema::{schema_to_json, Column};
use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

/// `status` of an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadStatus {
    Pending,
    Completed,
    Cancelled,
    Failed,
}

impl UploadStatus {
    /// The wire and database value.
    pub fn as_str(self) -> &'static str {
        match self {
            UploadStatus::Pending => "PENDING",
            UploadStatus::Completed => "COMPLETED",
            UploadStatus::Cancelled => "CANCELLED",
            UploadStatus::Failed => "FAILED",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "PENDING" => UploadStatus::Pending,
            "COMPLETED" => UploadStatus::Completed,
            "CANCELLED" => UploadStatus::Cancelled,
            "FAILED" => UploadStatus::Failed,
            other => {
                return Err(StoreError::Invalid(format!(
                    "stored upload status `{other}` is unknown"
                )))
            }
        })
    }
}

/// An upload row.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// `dsupload-<ULID>`.
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub folder: Option<String>,
    pub description: Option<String>,
    pub schema: Vec<Column>,
    pub status: UploadStatus,
    pub error: Option<String>,
    /// The dataset it created, once `COMPLETED`.
    pub dataset_id: Option<String>,
    /// The parts that completed it, in order.
    pub part_ids: Option<Vec<String>>,
    /// Where an import reads from (becomes the dataset's `source`).
    pub source: Option<Value>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
}

/// What [`Store::create_upload`] needs; everything already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NewUpload {
    pub project_id: String,
    pub name: String,
    pub folder: Option<String>,
    pub description: Option<String>,
    pub schema: Vec<Column>,
    /// Where an import reads from; `None` for a multipart upload.
    pub source: Option<Value>,
}

/// A received part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPart {
    /// `dspart-<ULID>`.
    pub id: String,
    pub upload_id: String,
    pub blob_key: String,
    pub rows: i64,
    pub bytes: i64,
    pub created_at: i64,
}

pub(super) const UPLOAD_COLUMNS: &str =
    "id, project_id, name, folder, description, schema, status, error, \
     dataset_id, part_ids, source, created_at, completed_at";

/// A new part id (the caller names the part's blob after it before the
/// row exists).
pub fn new_part_id() -> String {
    new_id(ids::DATASET_PART)
}

/// Where the Parquet file of part `part_id` of upload `upload_id` lives.
pub fn part_blob_key(upload_id: &str, part_id: &str) -> String {
    format!("datasets/uploads/{upload_id}/{part_id}.parquet")
}

impl Upload {
    pub(super) fn from_row(row: &AnyRow) -> Result<Self> {
        let schema = stored_schema(row, "upload")?;
        let part_ids: Option<String> = row.try_get("part_ids")?;
        let source: Option<String> = row.try_get("source")?;
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            name: row.try_get("name")?,
            folder: row.try_get("folder")?,
            description: row.try_get("description")?,
            schema,
            status: UploadStatus::parse(&row.try_get::<String, _>("status")?)?,
            error: row.try_get("error")?,
            dataset_id: row.try_get("dataset_id")?,
            part_ids: part_ids.and_then(|p| serde_json::from_str(&p).ok()),
            source: source.and_then(|s| serde_json::from_str(&s).ok()),
            created_at: row.try_get("created_at")?,
            completed_at: row.try_get("completed_at")?,
        })
    }
}

impl UploadPart {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            upload_id: row.try_get("upload_id")?,
            blob_key: row.try_get("blob_key")?,
            rows: row.try_get("row_count")?,
            bytes: row.try_get("bytes")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

impl Store {
    /// Creates an upload, `PENDING`.
    pub async fn create_upload(&self, new: NewUpload) -> Result<Upload> {
        let upload = Upload {
            id: new_id(ids::DATASET_UPLOAD),
            project_id: new.project_id,
            name: new.name,
            folder: new.folder,
            description: new.description,
            schema: new.schema,
            status: UploadStatus::Pending,
            error: None,
            dataset_id: None,
            part_ids: None,
            source: new.source,
            created_at: now(),
            completed_at: None,
        };
        sqlx::query(
            "INSERT INTO dataset_uploads (id, project_id, name, folder, description, schema, \
             status, source, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&upload.id)
        .bind(&upload.project_id)
        .bind(&upload.name)
        .bind(&upload.folder)
        .bind(&upload.description)
        .bind(schema_to_json(&upload.schema).to_string())
        .bind(upload.status.as_str())
        .bind(upload.source.as_ref().map(Value::to_string))
        .bind(upload.created_at)
        .execute(&self.pool)
        .await?;
        Ok(upload)
    }

    /// The upload `id` whatever its project ([`StoreError::NotFound`] when
    /// missing); the caller checks the project.
    pub async fn upload_by_id(&self, id: &str) -> Result<Upload> {
        let row = sqlx::query(&format!(
            "SELECT {UPLOAD_COLUMNS} FROM dataset_uploads WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => Upload::from_row(&row),
            None => Err(StoreError::NotFound("upload")),
        }
    }

    /// The parts received for upload `id`, oldest first.
    pub async fn upload_parts(&self, id: &str) -> Result<Vec<UploadPart>> {
        let rows = sqlx::query(
            "SELECT id, upload_id, blob_key, row_count, bytes, created_at \
             FROM dataset_upload_parts WHERE upload_id = $1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(UploadPart::from_row).collect()
    }

    /// Records a part (its Parquet file already under `blob_key`) while the
    /// upload is `PENDING` and has fewer than `max_parts` parts; else
    /// [`StoreError::InUse`] saying why (the caller deletes the blob).
    pub async fn add_upload_part(
        &self,
        upload_id: &str,
        part_id: &str,
        blob_key: &str,
        rows: i64,
        bytes: i64,
        max_parts: i64,
    ) -> Result<UploadPart> {
        let part = UploadPart {
            id: part_id.to_string(),
            upload_id: upload_id.to_string(),
            blob_key: blob_key.to_string(),
            rows,
            bytes,
            created_at: now(),
        };
        // One statement, so a concurrent complete or cancel either sees the
        // part or makes the insert a no-op.
        let inserted = sqlx::query(
            "INSERT INTO dataset_upload_parts (id, upload_id, blob_key, row_count, bytes, \
             created_at) SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM \
             dataset_uploads WHERE id = $2 AND status = 'PENDING') AND (SELECT COUNT(*) FROM \
             dataset_upload_parts WHERE upload_id = $2) < $7",
        )
        .bind(&part.id)
        .bind(&part.upload_id)
        .bind(&part.blob_key)
        .bind(part.rows)
        .bind(part.bytes)
        .bind(part.created_at)
        .bind(max_parts)
        .execute(&self.pool)
        .await?;
        if inserted.rows_affected() == 1 {
            return Ok(part);
        }
        let upload = self.upload_by_id(upload_id).await?;
        if upload.status != UploadStatus::Pending {
            return Err(StoreError::InUse(format!(
                "The upload `{upload_id}` is {}; it takes no more parts.",
                upload.status.as_str()
            )));
        }
        Err(StoreError::InUse(format!(
            "The upload `{upload_id}` already has {max_parts} parts, the most it may have."
        )))
    }

    /// Completes upload `id` with `part_ids` (its parts, in the dataset's
    /// order; each at most once): creates the dataset over them and marks
    /// the upload `COMPLETED`, in one transaction. Completing again with
    /// the same list answers the same upload and dataset; with another
    /// list, or once cancelled, [`StoreError::InUse`]. An id that is not a
    /// part of this upload is [`StoreError::Invalid`] naming it. Also
    /// returns the blob keys of the parts left out, for the caller to
    /// delete.
    /// What completing an upload that is no longer `PENDING` answers: the
    /// same upload and dataset when it was completed with these parts, else
    /// [`StoreError::InUse`].
    async fn settled_answer(
        &self,
        upload: Upload,
        part_ids: &[String],
    ) -> Result<(Upload, Dataset, Vec<String>)> {
        let id = &upload.id;
        match upload.status {
            UploadStatus::Completed if upload.part_ids.as_deref() == Some(part_ids) => {
                let dataset_id = upload.dataset_id.clone().unwrap_or_default();
                let dataset = self.dataset_by_id(&dataset_id).await?;
                Ok((upload, dataset, Vec::new()))
            }
            UploadStatus::Completed => Err(StoreError::InUse(format!(
                "The upload `{id}` was already completed with other parts."
            ))),
            status => Err(StoreError::InUse(format!(
                "The upload `{id}` is {}; it cannot be completed.",
                status.as_str()
            ))),
        }
    }

    pub async fn complete_upload(
        &self,
        id: &str,
        part_ids: &[String],
    ) -> Result<(Upload, Dataset, Vec<String>)> {
        let upload = self.upload_by_id(id).await?;
        if upload.status != UploadStatus::Pending {
            return self.settled_answer(upload, part_ids).await;
        }
        if part_ids.is_empty() {
            return Err(StoreError::Invalid(
                "`part_ids` must name at least one part.".into(),
            ));
        }
        let parts = self.upload_parts(id).await?;
        let mut chosen = Vec::with_capacity(part_ids.len());
        for (i, part_id) in part_ids.iter().enumerate() {
            if part_ids[..i].contains(part_id) {
                return Err(StoreError::Invalid(format!(
                    "`part_ids`: the part `{part_id}` is named twice."
                )));
            }
            let Some(part) = parts.iter().find(|p| &p.id == part_id) else {
                // A completion that ran meanwhile deleted the parts it left
                // out: answer as it had ended before this one began.
                let now = self.upload_by_id(id).await?;
                if now.status != UploadStatus::Pending {
                    return self.settled_answer(now, part_ids).await;
                }
                return Err(StoreError::Invalid(format!(
                    "`part_ids`: `{part_id}` is not a part of the upload `{id}`."
                )));
            };
            chosen.push(StoredPart {
                blob_key: part.blob_key.clone(),
                rows: part.rows,
                bytes: part.bytes,
            });
        }
        let left_out: Vec<&UploadPart> =
            parts.iter().filter(|p| !part_ids.contains(&p.id)).collect();

        let mut tx = self.pool.begin().await?;
        let dataset = insert_dataset(
            &mut tx,
            NewDataset {
                project_id: upload.project_id.clone(),
                name: upload.name.clone(),
                folder: upload.folder.clone(),
                description: upload.description.clone(),
                schema: upload.schema.clone(),
                source: Some(
                    upload
                        .source
                        .clone()
                        .unwrap_or_else(|| json!({"type": "upload", "upload_id": id})),
                ),
                parts: chosen,
            },
        )
        .await?;
        let completed_at = now();
        let list = Value::from(part_ids.to_vec()).to_string();
        let updated = sqlx::query(
            "UPDATE dataset_uploads SET status = 'COMPLETED', dataset_id = $1, part_ids = $2, \
             completed_at = $3 WHERE id = $4 AND status = 'PENDING'",
        )
        .bind(&dataset.id)
        .bind(&list)
        .bind(completed_at)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            // Another request completed or cancelled it meanwhile: nothing
            // of this one is kept; answer as that one left it.
            tx.rollback().await?;
            return Box::pin(self.complete_upload(id, part_ids)).await;
        }
        for part in &left_out {
            sqlx::query("DELETE FROM dataset_upload_parts WHERE id = $1")
                .bind(&part.id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        let upload = self.upload_by_id(id).await?;
        let left_out = left_out.into_iter().map(|p| p.blob_key.clone()).collect();
        Ok((upload, dataset, left_out))
    }

    /// Cancels upload `id` while `PENDING` (a cancelled one answers as it
    /// is); [`StoreError::InUse`] once completed. Returns the upload and
    /// the blob keys of its parts, for the caller to delete.
    pub async fn cancel_upload(&self, id: &str) -> Result<(Upload, Vec<String>)> {
        let updated = sqlx::query(
            "UPDATE dataset_uploads SET status = 'CANCELLED', completed_at = $1 \
             WHERE id = $2 AND status = 'PENDING'",
        )
        .bind(now())
        .bind(id)
        .execute(&self.pool)
        .await?;
        let upload = self.upload_by_id(id).await?;
        match upload.status {
            UploadStatus::Cancelled | UploadStatus::Failed => {}
            status => {
                debug_assert_eq!(updated.rows_affected(), 0);
                return Err(StoreError::InUse(format!(
                    "The upload `{id}` is {}; it cannot be cancelled.",
                    status.as_str()
                )));
            }
        }
        let keys = self.drop_upload_parts(id).await?;
        Ok((upload, keys))
    }

    /// Sets the schema of a `PENDING` upload (an import's, once inferred).
    pub async fn set_upload_schema(&self, id: &str, schema: &[Column]) -> Result<()> {
        sqlx::query("UPDATE dataset_uploads SET schema = $1 WHERE id = $2 AND status = 'PENDING'")
            .bind(schema_to_json(schema).to_string())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ends every `PENDING` upload created before `before` (seconds since
    /// the epoch) as `CANCELLED` with an error saying it expired; the blob
    /// keys of their parts, for the caller to delete.
    pub async fn expire_uploads(&self, before: i64) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM dataset_uploads WHERE status = 'PENDING' AND created_at < $1",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        let mut keys = Vec::new();
        for row in rows {
            let id: String = row.try_get("id")?;
            let updated = sqlx::query(
                "UPDATE dataset_uploads SET status = 'CANCELLED', completed_at = $1, \
                 error = 'expired: not completed in time' WHERE id = $2 AND status = 'PENDING'",
            )
            .bind(now())
            .bind(&id)
            .execute(&self.pool)
            .await?;
            if updated.rows_affected() == 1 {
                keys.extend(self.drop_upload_parts(&id).await?);
            }
        }
        Ok(keys)
    }

    /// Forgets the part rows of an upload that ended without them; their
    /// blob keys.
    pub(super) async fn drop_upload_parts(&self, id: &str) -> Result<Vec<String>> {
        let keys = self
            .upload_parts(id)
            .await?
            .into_iter()
            .map(|p| p.blob_key)
            .collect();
        sqlx::query("DELETE FROM dataset_upload_parts WHERE upload_id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(keys)
    }
}
