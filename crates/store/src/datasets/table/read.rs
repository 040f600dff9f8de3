//! Stored parts read back from the blob store: ranged reads of the footer
//! and of the column chunks of the row groups a read needs, nothing else.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::TryStreamExt;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStream};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use serde_json::{Map, Value};

use super::table_error;
use super::values::cell_json;
use crate::datasets::schema::Column;
use crate::{Blobs, StoreError};

/// One stored part of a dataset: its blob key and row count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRef {
    pub key: String,
    pub rows: u64,
}

/// An [`AsyncFileReader`] over a blob: ranged reads through
/// [`Blobs::get_range`], the metadata through
/// [`ParquetMetaDataReader::load_and_finish`] with the blob's size.
pub struct BlobFile {
    blobs: Blobs,
    key: String,
    size: u64,
}

impl BlobFile {
    /// The blob under `key` (its size asked of the store once).
    pub async fn open(blobs: &Blobs, key: &str) -> Result<Self, StoreError> {
        let size = blobs.size(key).await?;
        Ok(Self::new(blobs.clone(), key.to_string(), size))
    }

    /// The blob under `key`, whose size is known.
    pub fn new(blobs: Blobs, key: String, size: u64) -> Self {
        Self { blobs, key, size }
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

impl AsyncFileReader for BlobFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.blobs
                .get_range(&self.key, range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let mut reader = ParquetMetaDataReader::new();
            if let Some(options) = options {
                reader = reader
                    .with_metadata_options(Some(options.metadata_options().clone()))
                    .with_column_index_policy(options.column_index_policy())
                    .with_offset_index_policy(options.offset_index_policy());
            }
            let size = self.size;
            Ok(Arc::new(reader.load_and_finish(self, size).await?))
        }
        .boxed()
    }
}

/// The row groups (of these row counts) that rows `offset..offset+limit`
/// of a part fall in, and the rows to skip in the first of them.
fn row_groups_for(
    group_rows: impl Iterator<Item = u64>,
    offset: u64,
    limit: Option<u64>,
) -> (Vec<usize>, u64) {
    let mut groups = Vec::new();
    let mut skip = offset;
    let mut covered = 0u64;
    for (i, rows) in group_rows.enumerate() {
        if limit == Some(0) {
            break;
        }
        if groups.is_empty() && skip >= rows {
            skip -= rows;
            continue;
        }
        groups.push(i);
        covered += rows;
        if limit.is_some_and(|limit| covered >= skip.saturating_add(limit)) {
            break;
        }
    }
    (groups, skip)
}

/// Opens a stored part for reading `schema`'s columns (those it has: a
/// column it lacks reads as null), from row `offset` of the part, at most
/// `limit` rows, in batches of `batch_rows`. Whole row groups before the
/// offset are skipped by the metadata, never fetched or decoded; within the
/// first row group kept, the pages before the offset are skipped through the
/// offset index.
pub(super) async fn open_part(
    blobs: &Blobs,
    key: &str,
    schema: &[Column],
    offset: u64,
    limit: Option<u64>,
    batch_rows: usize,
) -> Result<ParquetRecordBatchStream<BlobFile>, StoreError> {
    let file = BlobFile::open(blobs, key).await?;
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let builder = ParquetRecordBatchStreamBuilder::new_with_options(file, options)
        .await
        .map_err(table_error)?;
    let (groups, skip) = row_groups_for(
        builder
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as u64),
        offset,
        limit,
    );
    let fields = builder.schema().fields();
    let roots: Vec<usize> = fields
        .iter()
        .enumerate()
        .filter(|(_, f)| schema.iter().any(|c| c.name == *f.name()))
        .map(|(i, _)| i)
        .collect();
    let projection = ProjectionMask::roots(builder.parquet_schema(), roots);
    let mut builder = builder
        .with_row_groups(groups)
        .with_projection(projection)
        .with_batch_size(batch_rows.max(1));
    if skip > 0 {
        builder = builder.with_offset(skip as usize);
    }
    if let Some(limit) = limit {
        builder = builder.with_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    builder.build().map_err(table_error)
}

/// Rows `offset..offset+limit` of the dataset made of `parts` in order, as
/// JSON objects: every schema column present, null as JSON null, `json`
/// columns parsed back, integers as JSON integers. Whole parts are skipped
/// by their row counts and whole row groups by the Parquet metadata, so a
/// read deep into a large dataset decodes one or two row groups.
pub async fn read_rows(
    blobs: &Blobs,
    parts: &[PartRef],
    schema: &[Column],
    offset: u64,
    limit: usize,
) -> Result<Vec<Map<String, Value>>, StoreError> {
    let mut rows = Vec::with_capacity(limit.min(4096));
    let mut skip = offset;
    for part in parts {
        if rows.len() >= limit {
            break;
        }
        if skip >= part.rows {
            skip -= part.rows;
            continue;
        }
        let want = limit - rows.len();
        let mut stream = open_part(
            blobs,
            &part.key,
            schema,
            skip,
            Some(want as u64),
            want.min(8192),
        )
        .await?;
        skip = 0;
        while let Some(batch) = stream.try_next().await.map_err(table_error)? {
            let columns: Vec<_> = schema
                .iter()
                .map(|c| batch.column_by_name(&c.name))
                .collect();
            for row in 0..batch.num_rows() {
                let mut object = Map::new();
                for (column, array) in schema.iter().zip(&columns) {
                    let value = match array {
                        Some(array) => cell_json(&column.name, column.ty, array.as_ref(), row)?,
                        None => Value::Null,
                    };
                    object.insert(column.name.clone(), value);
                }
                rows.push(object);
            }
        }
    }
    rows.truncate(limit);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::row_groups_for;

    #[test]
    fn only_the_row_groups_holding_the_rows_asked() {
        let groups =
            |offset, limit| row_groups_for([100u64, 100, 100, 50].into_iter(), offset, limit);
        assert_eq!(groups(0, Some(10)), (vec![0], 0));
        assert_eq!(groups(0, Some(100)), (vec![0], 0));
        assert_eq!(groups(0, Some(101)), (vec![0, 1], 0));
        assert_eq!(groups(99, Some(2)), (vec![0, 1], 99));
        assert_eq!(groups(100, Some(1)), (vec![1], 0));
        assert_eq!(groups(250, Some(100)), (vec![2, 3], 50));
        assert_eq!(groups(300, None), (vec![3], 0));
        assert_eq!(groups(340, Some(1000)), (vec![3], 40));
        assert_eq!(groups(350, Some(10)), (vec![], 0));
        assert_eq!(groups(10, Some(0)), (vec![], 10));
        assert_eq!(groups(0, Some(u64::MAX)), (vec![0, 1, 2, 3], 0));
    }
}
