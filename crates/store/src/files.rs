//! Files: a row per file (scoped by project) and its content as a blob.
//!
//! An upload streams into a [`FileUpload`] (the blob, written in parts, and
//! the JSONL check) and becomes visible only when [`Store::finish_upload`]
//! has completed the blob and then committed the row.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::blobs::BlobWriter;
use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::jsonl::JsonlChecker;
use crate::Store;

/// `status` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStatus {
    /// Stored (and, for JSONL purposes, every line checked).
    Processed,
    /// A JSONL line is bad; `status_details` says which. The bytes are kept.
    Error,
}

impl FileStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            FileStatus::Processed => "processed",
            FileStatus::Error => "error",
        }
    }
}

/// Order of a list, by creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListOrder {
    Asc,
    #[default]
    Desc,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileRecord {
    pub id: String,
    pub project_id: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: i64,
    pub status: String,
    pub status_details: Option<String>,
    pub created_at: i64,
}

const COLUMNS: &str =
    "id, project_id, filename, purpose, bytes, status, status_details, created_at";

impl FileRecord {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            filename: row.try_get("filename")?,
            purpose: row.try_get("purpose")?,
            bytes: row.try_get("bytes")?,
            status: row.try_get("status")?,
            status_details: row.try_get("status_details")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// Whether `id` has the shape of a file id (`file-<ULID>`).
pub fn is_well_formed(id: &str) -> bool {
    ids::is_well_formed(ids::FILE, id)
}

/// An upload in progress.
pub struct FileUpload {
    pub id: String,
    writer: BlobWriter,
    checker: JsonlChecker,
    limit: u64,
}

impl FileUpload {
    /// Writes the next chunk; over the limit, the upload is given up and
    /// the error is [`StoreError::TooLarge`].
    pub async fn write(&mut self, chunk: &[u8]) -> Result<()> {
        if self.writer.bytes() + chunk.len() as u64 > self.limit {
            return Err(StoreError::TooLarge { limit: self.limit });
        }
        self.checker.feed(chunk);
        self.writer.write(chunk).await
    }

    pub fn bytes(&self) -> u64 {
        self.writer.bytes()
    }

    /// Gives the upload up; nothing is kept.
    pub async fn abort(self) {
        self.writer.abort().await
    }
}

/// Inserts a file row on `conn` (a pooled connection or a transaction).
pub(crate) async fn insert_file_on(conn: &mut sqlx::AnyConnection, f: &FileRecord) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO files ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    ))
    .bind(&f.id)
    .bind(&f.project_id)
    .bind(&f.filename)
    .bind(&f.purpose)
    .bind(f.bytes)
    .bind(&f.status)
    .bind(f.status_details.clone())
    .bind(f.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

impl Store {
    /// Starts an upload of at most `limit` bytes.
    pub async fn begin_upload(&self, limit: u64) -> Result<FileUpload> {
        let id = new_id(ids::FILE);
        let writer = self.blobs.writer(&id).await?;
        Ok(FileUpload {
            id,
            writer,
            checker: JsonlChecker::new(),
            limit,
        })
    }

    /// Completes the blob, then commits the row. `check_jsonl` marks the
    /// file `error` (with the bad line in `status_details`) when a line is
    /// not a JSON object.
    pub async fn finish_upload(
        &self,
        upload: FileUpload,
        project_id: &str,
        filename: &str,
        purpose: &str,
        check_jsonl: bool,
    ) -> Result<FileRecord> {
        let FileUpload {
            id,
            writer,
            checker,
            ..
        } = upload;
        let verdict = checker.finish();
        let bytes = writer.finish().await?;
        let (status, status_details) = match verdict {
            Some(problem) if check_jsonl => (FileStatus::Error, Some(problem)),
            _ => (FileStatus::Processed, None),
        };
        let record = FileRecord {
            id,
            project_id: project_id.to_string(),
            filename: filename.to_string(),
            purpose: purpose.to_string(),
            bytes: bytes as i64,
            status: status.as_str().to_string(),
            status_details,
            created_at: now(),
        };
        if let Err(e) = self.insert_file(&record).await {
            let _ = self.blobs.delete(&record.id).await;
            return Err(e);
        }
        Ok(record)
    }

    pub(crate) async fn insert_file(&self, f: &FileRecord) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        insert_file_on(&mut conn, f).await
    }

    /// The file `id` of `project_id`; [`StoreError::NotFound`] when it does
    /// not exist or belongs to another project (the two look the same).
    pub async fn file(&self, project_id: &str, id: &str) -> Result<FileRecord> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM files WHERE project_id = $1 AND id = $2"
        ))
        .bind(project_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => FileRecord::from_row(&row),
            None => Err(StoreError::NotFound("file")),
        }
    }

    /// A page of the project's files: at most `limit`, optionally of one
    /// purpose, after the file `after` in `order` (ids sort by creation).
    /// Returns the page and whether more follow.
    pub async fn list_files(
        &self,
        project_id: &str,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: u32,
        order: ListOrder,
    ) -> Result<(Vec<FileRecord>, bool)> {
        let mut sql = format!("SELECT {COLUMNS} FROM files WHERE project_id = $1");
        let mut n = 1;
        if purpose.is_some() {
            n += 1;
            sql.push_str(&format!(" AND purpose = ${n}"));
        }
        if after.is_some() {
            n += 1;
            let cmp = if order == ListOrder::Asc { ">" } else { "<" };
            sql.push_str(&format!(" AND id {cmp} ${n}"));
        }
        let dir = if order == ListOrder::Asc {
            "ASC"
        } else {
            "DESC"
        };
        sql.push_str(&format!(" ORDER BY id {dir} LIMIT ${}", n + 1));
        let mut query = sqlx::query(&sql).bind(project_id);
        if let Some(purpose) = purpose {
            query = query.bind(purpose);
        }
        if let Some(after) = after {
            query = query.bind(after);
        }
        let rows = query
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let mut files = rows
            .iter()
            .map(FileRecord::from_row)
            .collect::<Result<Vec<_>>>()?;
        let has_more = files.len() > limit as usize;
        files.truncate(limit as usize);
        Ok((files, has_more))
    }

    /// What still uses the file: the ids of the fine-tuning jobs not yet
    /// over (`validating_files`, `queued`, `running`) whose training or
    /// validation file it is, then those of the batches not yet over
    /// (`validating`, `in_progress`, `finalizing`, `cancelling`) whose input
    /// file it is. [`Store::delete_file`] refuses while it returns anything.
    pub async fn file_users(&self, file_id: &str) -> Result<Vec<String>> {
        let mut users = self.ft_jobs_using_file(file_id).await?;
        users.extend(self.batches_using_file(file_id).await?);
        Ok(users)
    }

    /// Deletes the file's row, then its blob. Refused with
    /// [`StoreError::InUse`] while a job or a batch uses the file (see
    /// [`Store::file_users`]).
    pub async fn delete_file(&self, project_id: &str, id: &str) -> Result<()> {
        self.file(project_id, id).await?;
        let users = self.file_users(id).await?;
        if !users.is_empty() {
            return Err(StoreError::InUse(format!(
                "the file `{id}` is in use by {}",
                users.join(", ")
            )));
        }
        let done = sqlx::query("DELETE FROM files WHERE project_id = $1 AND id = $2")
            .bind(project_id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound("file"));
        }
        self.blobs.delete(id).await
    }

    /// The content of a file (already checked to be the caller's).
    pub async fn file_content(
        &self,
        file: &FileRecord,
    ) -> Result<futures_util::stream::BoxStream<'static, Result<bytes::Bytes>>> {
        self.blobs.read(&file.id).await
    }

    /// The file `id` whatever its project (for signed links, which carry
    /// their own authority).
    pub async fn file_by_id(&self, id: &str) -> Result<FileRecord> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM files WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => FileRecord::from_row(&row),
            None => Err(StoreError::NotFound("file")),
        }
    }

    pub(crate) async fn all_file_ids(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT id FROM files")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("id")?))
            .collect()
    }
}
