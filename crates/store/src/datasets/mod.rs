//! Datasets: typed tables uploaded in parts, stored as Parquet.
//!
//! [`schema`] names the column types and checks schemas; [`table`] turns a
//! part (JSON Lines, CSV or Parquet) into a checked Parquet file and reads
//! stored parts back (rows at an offset, streamed exports); `records` and
//! `uploads` keep the datasets' and the multipart uploads' rows (a dataset
//! is its ordered Parquet parts in the blob store, with their row counts).

mod imports;
mod records;
pub mod schema;
pub mod table;
mod uploads;

pub use imports::{ImportClaim, ImportClaimRules};
pub use records::{
    is_well_formed_dataset_id, names_dataset, Dataset, DatasetPatch, DatasetSort, NewDataset,
    StoredPart,
};
pub use uploads::{new_part_id, part_blob_key, NewUpload, Upload, UploadPart, UploadStatus};

use schema::{Column, ColumnType};

/// The columns a fine-tuning job reads from a dataset: `messages` (a json
/// column) for chat examples, else `prompt` and `completion` (string
/// columns); `None` when the schema has neither.
pub fn training_columns(schema: &[Column]) -> Option<Vec<String>> {
    let has = |name: &str, ty: ColumnType| schema.iter().any(|c| c.name == name && c.ty == ty);
    if has("messages", ColumnType::Json) {
        Some(vec!["messages".into()])
    } else if has("prompt", ColumnType::String) && has("completion", ColumnType::String) {
        Some(vec!["prompt".into(), "completion".into()])
    } else {
        None
    }
}

/// Why a dataset cannot be trained on, for messages.
pub const TRAINING_COLUMNS_NEEDED: &str =
    "a `messages` column of type json, or `prompt` and `completion` columns of type string";

impl crate::Store {
    /// Dataset `dataset` as fine-tuning lines: JSON Lines of its
    /// [`training_columns`], streamed as read; [`crate::StoreError::Invalid`]
    /// when it has none.
    pub async fn dataset_training_lines(
        &self,
        dataset: &Dataset,
    ) -> crate::Result<futures_util::stream::BoxStream<'static, crate::Result<bytes::Bytes>>> {
        let columns = training_columns(&dataset.schema).ok_or_else(|| {
            crate::StoreError::Invalid(format!(
                "The dataset `{}` cannot be trained on: it needs {TRAINING_COLUMNS_NEEDED}.",
                dataset.id
            ))
        })?;
        let parts = self.dataset_parts(&dataset.id).await?;
        Ok(table::export(
            self.blobs().clone(),
            parts,
            dataset.schema.clone(),
            columns,
            table::ExportFormat::Jsonl,
            None,
        ))
    }
}
