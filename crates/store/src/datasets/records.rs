//! Dataset rows: create (from stored Parquet parts), read, list, patch,
//! delete.

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::schema::{schema_from_json, schema_to_json, Column};
use super::table::PartRef;
use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

/// A dataset row.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// `dataset-<ULID>`.
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub folder: Option<String>,
    pub description: Option<String>,
    pub schema: Vec<Column>,
    pub row_count: i64,
    pub bytes: i64,
    /// Where the rows came from (a JSON object), if recorded.
    pub source: Option<Value>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One stored Parquet part of a new dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPart {
    pub blob_key: String,
    pub rows: i64,
    pub bytes: i64,
}

/// What [`Store::create_dataset`] needs; everything already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDataset {
    pub project_id: String,
    pub name: String,
    pub folder: Option<String>,
    pub description: Option<String>,
    pub schema: Vec<Column>,
    pub source: Option<Value>,
    /// In order.
    pub parts: Vec<StoredPart>,
}

/// The order of a dataset list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetSort {
    CreatedAt,
    Name,
}

/// A change to a dataset's descriptive fields (`None`: unchanged;
/// `Some(None)`: cleared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatasetPatch {
    pub name: Option<String>,
    pub folder: Option<Option<String>>,
    pub description: Option<Option<String>>,
}

/// Whether `id` has the shape of a dataset id.
pub fn is_well_formed_dataset_id(id: &str) -> bool {
    ids::is_well_formed(ids::DATASET, id)
}

/// Whether `id` names a dataset rather than a file (where either may
/// stand, as a fine-tuning job's training file).
pub fn names_dataset(id: &str) -> bool {
    id.strip_prefix(ids::DATASET)
        .is_some_and(|rest| rest.starts_with('-'))
}

const COLUMNS: &str = "id, project_id, name, folder, description, schema, row_count, \
     bytes, source, created_at, updated_at";

/// The `schema` column of a dataset or upload row, parsed.
pub(super) fn stored_schema(row: &AnyRow, what: &str) -> Result<Vec<Column>> {
    let text: String = row.try_get("schema")?;
    // An import without a schema holds none until it is inferred.
    if text == "[]" {
        return Ok(Vec::new());
    }
    serde_json::from_str(&text)
        .map_err(|e| e.to_string())
        .and_then(|v| schema_from_json(&v))
        .map_err(|e| StoreError::Invalid(format!("stored {what} schema: {e}")))
}

impl Dataset {
    pub(super) fn from_row(row: &AnyRow) -> Result<Self> {
        let schema = stored_schema(row, "dataset")?;
        let source: Option<String> = row.try_get("source")?;
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            name: row.try_get("name")?,
            folder: row.try_get("folder")?,
            description: row.try_get("description")?,
            schema,
            row_count: row.try_get("row_count")?,
            bytes: row.try_get("bytes")?,
            source: source.and_then(|s| serde_json::from_str(&s).ok()),
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl Store {
    /// Creates a dataset over Parquet parts already in the blob store.
    pub async fn create_dataset(&self, new: NewDataset) -> Result<Dataset> {
        let mut tx = self.pool.begin().await?;
        let dataset = insert_dataset(&mut tx, new).await?;
        tx.commit().await?;
        Ok(dataset)
    }

    /// The dataset `id` whatever its project ([`StoreError::NotFound`]
    /// when missing); the caller checks the project.
    pub async fn dataset_by_id(&self, id: &str) -> Result<Dataset> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM datasets WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => Dataset::from_row(&row),
            None => Err(StoreError::NotFound("dataset")),
        }
    }

    /// The Parquet parts of dataset `id`, in order.
    pub async fn dataset_parts(&self, id: &str) -> Result<Vec<PartRef>> {
        let rows = sqlx::query(
            "SELECT blob_key, row_count FROM dataset_parts WHERE dataset_id = $1 ORDER BY idx",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PartRef {
                    key: row.try_get("blob_key")?,
                    rows: row.try_get::<i64, _>("row_count")?.max(0) as u64,
                })
            })
            .collect()
    }

    /// A page of the project's datasets in the order `sort` (`descending`
    /// or not; ties by id): at most `limit`, after the dataset `after`
    /// when given (its position in that order). Returns the page and
    /// whether more follow. An `after` that names no dataset of the project
    /// is [`StoreError::Invalid`].
    pub async fn list_datasets(
        &self,
        project_id: &str,
        sort: DatasetSort,
        descending: bool,
        limit: i64,
        after: Option<&str>,
    ) -> Result<(Vec<Dataset>, bool)> {
        let (cmp, dir) = if descending {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        let mut sql = format!("SELECT {COLUMNS} FROM datasets WHERE project_id = $1");
        let mut cursor_name = None;
        if let Some(after) = after {
            let row = sqlx::query("SELECT name FROM datasets WHERE id = $1 AND project_id = $2")
                .bind(after)
                .bind(project_id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| {
                    StoreError::Invalid(format!("`after`: no dataset `{after}` in this project"))
                })?;
            match sort {
                DatasetSort::CreatedAt => sql.push_str(&format!(" AND id {cmp} $2")),
                DatasetSort::Name => {
                    cursor_name = Some(row.try_get::<String, _>("name")?);
                    sql.push_str(&format!(
                        " AND (name {cmp} $3 OR (name = $3 AND id {cmp} $2))"
                    ));
                }
            }
        }
        match sort {
            DatasetSort::CreatedAt => sql.push_str(&format!(" ORDER BY id {dir}")),
            DatasetSort::Name => sql.push_str(&format!(" ORDER BY name {dir}, id {dir}")),
        }
        sql.push_str(&format!(" LIMIT {}", limit.max(0) + 1));
        let mut query = sqlx::query(&sql).bind(project_id);
        if let Some(after) = after {
            query = query.bind(after);
        }
        if let Some(name) = &cursor_name {
            query = query.bind(name);
        }
        let rows = query.fetch_all(&self.pool).await?;
        let mut page = rows
            .iter()
            .map(Dataset::from_row)
            .collect::<Result<Vec<_>>>()?;
        let has_more = page.len() as i64 > limit;
        page.truncate(limit.max(0) as usize);
        Ok((page, has_more))
    }

    /// Changes the descriptive fields of dataset `id`; the updated row.
    pub async fn patch_dataset(&self, id: &str, patch: DatasetPatch) -> Result<Dataset> {
        let current = self.dataset_by_id(id).await?;
        let name = patch.name.unwrap_or(current.name);
        let folder = patch.folder.unwrap_or(current.folder);
        let description = patch.description.unwrap_or(current.description);
        sqlx::query(
            "UPDATE datasets SET name = $1, folder = $2, description = $3, updated_at = $4 \
             WHERE id = $5",
        )
        .bind(&name)
        .bind(&folder)
        .bind(&description)
        .bind(now().max(current.updated_at))
        .bind(id)
        .execute(&self.pool)
        .await?;
        self.dataset_by_id(id).await
    }

    /// Deletes dataset `id`'s row (and its parts' rows); the blob keys of
    /// its parts, for the caller to remove. [`StoreError::InUse`] while a
    /// fine-tuning job that has not ended trains from it.
    pub async fn delete_dataset(&self, id: &str) -> Result<Vec<String>> {
        let users = sqlx::query(&format!(
            "SELECT id FROM fine_tuning_jobs WHERE (training_file = $1 OR validation_file = $1) \
             AND status IN {}",
            crate::fine_tuning::ACTIVE
        ))
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        if let Some(job) = users.first() {
            let job: String = job.try_get("id")?;
            return Err(StoreError::InUse(format!(
                "The dataset `{id}` is in use by the fine-tuning job `{job}`."
            )));
        }
        let keys = self
            .dataset_parts(id)
            .await?
            .into_iter()
            .map(|p| p.key)
            .collect();
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM dataset_parts WHERE dataset_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let deleted = sqlx::query("DELETE FROM datasets WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound("dataset"));
        }
        Ok(keys)
    }
}

/// Inserts a dataset and its parts inside `tx`.
pub(super) async fn insert_dataset(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    new: NewDataset,
) -> Result<Dataset> {
    let created = now();
    let dataset = Dataset {
        id: new_id(ids::DATASET),
        project_id: new.project_id,
        name: new.name,
        folder: new.folder,
        description: new.description,
        row_count: new.parts.iter().map(|p| p.rows).sum(),
        bytes: new.parts.iter().map(|p| p.bytes).sum(),
        schema: new.schema,
        source: new.source,
        created_at: created,
        updated_at: created,
    };
    sqlx::query(
        "INSERT INTO datasets (id, project_id, name, folder, description, schema, row_count, \
         bytes, source, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(&dataset.id)
    .bind(&dataset.project_id)
    .bind(&dataset.name)
    .bind(&dataset.folder)
    .bind(&dataset.description)
    .bind(schema_to_json(&dataset.schema).to_string())
    .bind(dataset.row_count)
    .bind(dataset.bytes)
    .bind(dataset.source.as_ref().map(Value::to_string))
    .bind(dataset.created_at)
    .bind(dataset.updated_at)
    .execute(&mut **tx)
    .await?;
    for (idx, part) in new.parts.iter().enumerate() {
        sqlx::query(
            "INSERT INTO dataset_parts (dataset_id, idx, blob_key, row_count, bytes) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&dataset.id)
        .bind(idx as i64)
        .bind(&part.blob_key)
        .bind(part.rows)
        .bind(part.bytes)
        .execute(&mut **tx)
        .await?;
    }
    Ok(dataset)
}
