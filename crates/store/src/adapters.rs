//! LoRA adapters imported from outside (PEFT folders), registered per
//! project and served like fine-tuned models under
//! `<base>:<name>:<adapter id>`.
//!
//! A row names the adapter, its base model and the model name requests use;
//! its files (PEFT's two, already checked against the base by the caller)
//! live in blobs under [`adapter_blob_prefix`], written before the row
//! commits (a crash leaves at most blobs without a row, never served) and
//! removed after it is deleted. Names are unique within a project.

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::fine_tuning::ResultFile;
use crate::ids::{self, new_id, now};
use crate::Store;

/// An imported adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedAdapter {
    /// `adapter-<ULID>`.
    pub id: String,
    pub project_id: String,
    /// The name given at import (unique in the project).
    pub name: String,
    /// The base model's catalogue id.
    pub base_model: String,
    /// The model name requests use: `<base>:<name>:<id>`.
    pub model: String,
    /// What the caller recorded about it (rank, alpha, targets), a JSON
    /// object.
    pub details: Value,
    pub created_at: i64,
}

/// What [`Store::create_adapter`] needs; the files already checked.
#[derive(Debug, Clone)]
pub struct NewAdapter<'a> {
    pub project_id: &'a str,
    pub name: &'a str,
    pub base_model: &'a str,
    pub details: Value,
    /// Stored under [`adapter_blob_prefix`]`/<filename>`.
    pub files: &'a [ResultFile<'a>],
}

/// Where an adapter's files live: `adapters/<id>`.
pub fn adapter_blob_prefix(id: &str) -> String {
    format!("adapters/{id}")
}

/// Whether `id` has the shape of an adapter id (`adapter-<ULID>`).
pub fn is_well_formed_adapter_id(id: &str) -> bool {
    ids::is_well_formed(ids::ADAPTER, id)
}

/// Longest adapter name.
pub const MAX_NAME_CHARS: usize = 64;

/// Why `name` cannot name an adapter, if it cannot: 1 to 64 letters,
/// digits, `-`, `_` and `.` (as a fine-tuning job's suffix).
pub fn name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!ok).then(|| {
        format!(
            "the adapter name `{name}` must be 1 to {MAX_NAME_CHARS} letters, digits, `-`, `_` or `.`"
        )
    })
}

const COLUMNS: &str = "id, project_id, name, base_model, model, details, created_at";

impl ImportedAdapter {
    fn from_row(row: &AnyRow) -> Result<Self> {
        let details: String = row.try_get("details")?;
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            name: row.try_get("name")?,
            base_model: row.try_get("base_model")?,
            model: row.try_get("model")?,
            details: serde_json::from_str(&details).map_err(|e| {
                StoreError::Invalid(format!("stored adapter `details` is not JSON: {e}"))
            })?,
            created_at: row.try_get("created_at")?,
        })
    }
}

impl Store {
    /// Registers an adapter for a project: its files first, then the row.
    /// [`StoreError::Invalid`] for a bad name, an unknown project, or a name
    /// the project already uses.
    pub async fn create_adapter(&self, new: NewAdapter<'_>) -> Result<ImportedAdapter> {
        if let Some(problem) = name_problem(new.name) {
            return Err(StoreError::Invalid(problem));
        }
        if self.project(new.project_id).await?.is_none() {
            return Err(StoreError::Invalid(format!(
                "the project `{}` does not exist",
                new.project_id
            )));
        }
        let taken = || {
            StoreError::Invalid(format!(
                "the project already has an adapter named `{}`",
                new.name
            ))
        };
        if self
            .adapter_by_name(new.project_id, new.name)
            .await?
            .is_some()
        {
            return Err(taken());
        }
        let id = new_id(ids::ADAPTER);
        let adapter = ImportedAdapter {
            model: format!("{}:{}:{id}", new.base_model, new.name),
            id,
            project_id: new.project_id.to_string(),
            name: new.name.to_string(),
            base_model: new.base_model.to_string(),
            details: new.details,
            created_at: now(),
        };
        let prefix = adapter_blob_prefix(&adapter.id);
        for f in new.files {
            self.blobs
                .put(&format!("{prefix}/{}", f.filename), f.bytes)
                .await?;
        }
        let inserted = sqlx::query(&format!(
            "INSERT INTO imported_adapters ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
        ))
        .bind(&adapter.id)
        .bind(&adapter.project_id)
        .bind(&adapter.name)
        .bind(&adapter.base_model)
        .bind(&adapter.model)
        .bind(adapter.details.to_string())
        .bind(adapter.created_at)
        .execute(&self.pool)
        .await;
        if let Err(e) = inserted {
            let _ = self.blobs.delete_prefix(&prefix).await;
            // Two imports of one name at once: the unique index refused one.
            if self
                .adapter_by_name(new.project_id, new.name)
                .await?
                .is_some()
            {
                return Err(taken());
            }
            return Err(e.into());
        }
        Ok(adapter)
    }

    /// The adapter `id` of `project_id`; [`StoreError::NotFound`] when it
    /// does not exist or belongs to another project.
    pub async fn adapter(&self, project_id: &str, id: &str) -> Result<ImportedAdapter> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM imported_adapters WHERE project_id = $1 AND id = $2"
        ))
        .bind(project_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => ImportedAdapter::from_row(&row),
            None => Err(StoreError::NotFound("adapter")),
        }
    }

    /// The project's adapter named `name`, if any.
    pub async fn adapter_by_name(
        &self,
        project_id: &str,
        name: &str,
    ) -> Result<Option<ImportedAdapter>> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM imported_adapters WHERE project_id = $1 AND name = $2"
        ))
        .bind(project_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(ImportedAdapter::from_row).transpose()
    }

    /// The adapters of `project_id` (of every project for `None`), oldest
    /// first.
    pub async fn list_adapters(&self, project_id: Option<&str>) -> Result<Vec<ImportedAdapter>> {
        let rows = match project_id {
            Some(p) => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM imported_adapters WHERE project_id = $1 ORDER BY id"
                ))
                .bind(p)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM imported_adapters ORDER BY id"
                ))
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(ImportedAdapter::from_row).collect()
    }

    /// Deletes the adapter `id` (of any project): the row, then its files.
    /// [`StoreError::NotFound`] when there is none.
    pub async fn delete_adapter(&self, id: &str) -> Result<ImportedAdapter> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM imported_adapters WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::NotFound("adapter"));
        };
        let adapter = ImportedAdapter::from_row(&row)?;
        sqlx::query("DELETE FROM imported_adapters WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        self.blobs
            .delete_prefix(&adapter_blob_prefix(&adapter.id))
            .await?;
        Ok(adapter)
    }
}
