//! A dataset exported as CSV or JSON Lines: a stream of chunks made as the
//! parts are read, one record batch in memory at a time.

use arrow_array::RecordBatch;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::TryStreamExt;
use parquet::arrow::async_reader::ParquetRecordBatchStream;

use super::read::{open_part, BlobFile, PartRef};
use super::table_error;
use super::values::{cell_text, write_cell_json};
use crate::datasets::schema::{Column, ColumnType};
use crate::{Blobs, StoreError};

/// Rows per record batch read for an export.
const EXPORT_BATCH_ROWS: usize = 1024;
/// A chunk goes out once it holds this many bytes.
const CHUNK_BYTES: usize = 64 * 1024;

/// What an export is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A header row, then one record a row (RFC 4180 quoting; null as an
    /// empty cell; `json` columns as their JSON text; `true`/`false`).
    Csv,
    /// One JSON object a line, the selected columns in order.
    Jsonl,
}

/// The dataset made of `parts` as CSV or JSON Lines, `columns` (names of
/// `schema`'s columns, checked by the caller) selecting and ordering the
/// columns, at most `limit` rows. A stream of chunks (about 64 KiB, or one
/// record batch) made as it reads, in constant memory whatever the
/// dataset's size; an error midway ends the stream with the error. An empty
/// dataset is the header alone (CSV) or nothing (JSON Lines).
pub fn export(
    blobs: Blobs,
    parts: Vec<PartRef>,
    schema: Vec<Column>,
    columns: Vec<String>,
    format: ExportFormat,
    limit: Option<u64>,
) -> BoxStream<'static, Result<Bytes, StoreError>> {
    let selected: Vec<Column> = columns
        .iter()
        .map(|name| {
            let ty = schema
                .iter()
                .find(|c| c.name == *name)
                .map_or(ColumnType::String, |c| c.ty);
            Column::new(name.as_str(), ty)
        })
        .collect();
    let export = Export {
        blobs,
        parts: parts.into_iter(),
        columns: selected,
        format,
        remaining: limit,
        part: None,
        started: false,
        buf: Vec::new(),
    };
    stream::unfold(Some(export), |state| async move {
        let mut export = state?;
        match export.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(export))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

struct Export {
    blobs: Blobs,
    parts: std::vec::IntoIter<PartRef>,
    columns: Vec<Column>,
    format: ExportFormat,
    /// Rows still to write (`None`: all).
    remaining: Option<u64>,
    /// The part being read.
    part: Option<ParquetRecordBatchStream<BlobFile>>,
    /// Whether the CSV header is out.
    started: bool,
    buf: Vec<u8>,
}

impl Export {
    /// The next chunk, `None` at the end.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, StoreError> {
        if !self.started {
            self.started = true;
            if self.format == ExportFormat::Csv {
                let mut writer = csv::Writer::from_writer(std::mem::take(&mut self.buf));
                writer
                    .write_record(self.columns.iter().map(|c| c.name.as_str()))
                    .map_err(table_error)?;
                self.buf = writer.into_inner().map_err(table_error)?;
            }
        }
        loop {
            if self.buf.len() >= CHUNK_BYTES {
                return Ok(Some(Bytes::from(std::mem::take(&mut self.buf))));
            }
            if self.remaining == Some(0) {
                self.part = None;
                self.parts = Vec::new().into_iter();
            }
            if let Some(part) = &mut self.part {
                match part.try_next().await.map_err(table_error)? {
                    Some(batch) => self.write_batch(&batch)?,
                    None => self.part = None,
                }
                continue;
            }
            match self.parts.next() {
                Some(part) if part.rows == 0 => {}
                Some(part) => {
                    self.part = Some(
                        open_part(
                            &self.blobs,
                            &part.key,
                            &self.columns,
                            0,
                            self.remaining,
                            EXPORT_BATCH_ROWS,
                        )
                        .await?,
                    );
                }
                None if self.buf.is_empty() => return Ok(None),
                None => return Ok(Some(Bytes::from(std::mem::take(&mut self.buf)))),
            }
        }
    }

    fn write_batch(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        let rows = match self.remaining {
            Some(remaining) => batch
                .num_rows()
                .min(usize::try_from(remaining).unwrap_or(usize::MAX)),
            None => batch.num_rows(),
        };
        let arrays: Vec<_> = self
            .columns
            .iter()
            .map(|c| batch.column_by_name(&c.name))
            .collect();
        match self.format {
            ExportFormat::Csv => {
                let mut writer = csv::Writer::from_writer(std::mem::take(&mut self.buf));
                let mut record = Vec::with_capacity(self.columns.len());
                for row in 0..rows {
                    record.clear();
                    for (column, array) in self.columns.iter().zip(&arrays) {
                        record.push(match array {
                            Some(array) => cell_text(&column.name, column.ty, array.as_ref(), row)?,
                            None => "".into(),
                        });
                    }
                    writer
                        .write_record(record.iter().map(|c| c.as_bytes()))
                        .map_err(table_error)?;
                }
                self.buf = writer.into_inner().map_err(table_error)?;
            }
            ExportFormat::Jsonl => {
                for row in 0..rows {
                    self.buf.push(b'{');
                    for (i, (column, array)) in self.columns.iter().zip(&arrays).enumerate() {
                        if i > 0 {
                            self.buf.push(b',');
                        }
                        serde_json::to_writer(&mut self.buf, &column.name).map_err(table_error)?;
                        self.buf.push(b':');
                        match array {
                            Some(array) => write_cell_json(
                                &mut self.buf,
                                &column.name,
                                column.ty,
                                array.as_ref(),
                                row,
                            )?,
                            None => self.buf.extend_from_slice(b"null"),
                        }
                    }
                    self.buf.extend_from_slice(b"}\n");
                }
            }
        }
        if let Some(remaining) = &mut self.remaining {
            *remaining -= rows as u64;
        }
        Ok(())
    }
}
