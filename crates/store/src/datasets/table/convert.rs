//! Parts into Parquet: JSON Lines, CSV and Parquet parts checked row by row
//! against the schema and written as stored parts, one row group in memory
//! at a time.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::from_parquet::parquet_rows;
use super::values::{arrow_schema, ColumnBuilder};
use super::{PartError, PartFormat, PartStats, ROW_GROUP_ROWS};
use crate::datasets::schema::Column;

/// Reads the part at `input` (a local file) in `format`, checks every row
/// against `schema`, and writes it as Parquet to `output` (see the module
/// of [`super`] for the stored form). Streams: memory holds one row group
/// whatever the input's size. Blank lines of JSON Lines are skipped (they
/// still count for line numbers); a part without rows is `Ok` with 0 rows.
pub fn convert_part(
    input: &Path,
    format: PartFormat,
    schema: &[Column],
    output: &Path,
) -> Result<PartStats, PartError> {
    let mut out = PartWriter::create(output, schema)?;
    match format {
        PartFormat::Jsonl => jsonl_rows(input, schema, &mut out)?,
        PartFormat::Csv => csv_rows(input, schema, &mut out)?,
        PartFormat::Parquet => parquet_rows(input, schema, &mut out)?,
    }
    out.finish(output)
}

/// The stored part being written: the row group in the making, and the
/// Parquet writer that row groups go out through.
pub(super) struct PartWriter {
    arrow: SchemaRef,
    pub(super) columns: Vec<ColumnBuilder>,
    /// Rows in `columns`, not yet written.
    pending: usize,
    rows: u64,
    writer: ArrowWriter<File>,
}

fn write_error(e: impl std::error::Error + Send + Sync + 'static) -> PartError {
    PartError::Io(std::io::Error::other(e))
}

impl PartWriter {
    fn create(output: &Path, schema: &[Column]) -> Result<Self, PartError> {
        let arrow = arrow_schema(schema);
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let writer = ArrowWriter::try_new(File::create(output)?, arrow.clone(), Some(props))
            .map_err(write_error)?;
        Ok(Self {
            arrow,
            columns: schema
                .iter()
                .map(|c| ColumnBuilder::new(c.ty, ROW_GROUP_ROWS))
                .collect(),
            pending: 0,
            rows: 0,
            writer,
        })
    }

    /// Rows the row group in the making still takes.
    pub(super) fn room(&self) -> usize {
        ROW_GROUP_ROWS - self.pending
    }

    /// Counts `n` rows whose every column has been appended; writes the row
    /// group out when it is full.
    pub(super) fn rows_done(&mut self, n: usize) -> Result<(), PartError> {
        self.pending += n;
        self.rows += n as u64;
        if self.pending >= ROW_GROUP_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PartError> {
        if self.pending == 0 {
            return Ok(());
        }
        let arrays = self.columns.iter_mut().map(ColumnBuilder::finish).collect();
        let batch = RecordBatch::try_new(self.arrow.clone(), arrays).map_err(write_error)?;
        self.writer.write(&batch).map_err(write_error)?;
        self.writer.flush().map_err(write_error)?;
        self.pending = 0;
        Ok(())
    }

    fn finish(mut self, output: &Path) -> Result<PartStats, PartError> {
        self.flush()?;
        self.writer.close().map_err(write_error)?;
        Ok(PartStats {
            rows: self.rows,
            bytes: std::fs::metadata(output)?.len(),
        })
    }
}

// ---- JSON Lines ----

/// A JSON object's members, in their order.
pub(super) type Members = Vec<(String, Value)>;

/// One line of JSON Lines: an object's members, or what else the line held.
pub(super) enum JsonRow {
    Object(Members),
    Other(&'static str),
}

impl<'de> Deserialize<'de> for JsonRow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RowVisitor;
        impl<'de> Visitor<'de> for RowVisitor {
            type Value = JsonRow;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonRow, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Value>()? {
                    members.push(member);
                }
                Ok(JsonRow::Object(members))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonRow, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(JsonRow::Other("an array"))
            }
            fn visit_bool<E>(self, _: bool) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("a number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("a string"))
            }
            fn visit_unit<E>(self) -> Result<JsonRow, E> {
                Ok(JsonRow::Other("null"))
            }
        }
        deserializer.deserialize_any(RowVisitor)
    }
}

/// The rows of a JSON Lines part, line by line: each non-blank line's
/// 1-based number and members.
pub(super) struct JsonLines {
    reader: BufReader<File>,
    buf: Vec<u8>,
    line: u64,
}

impl JsonLines {
    pub(super) fn open(input: &Path) -> Result<Self, PartError> {
        Ok(Self {
            reader: BufReader::with_capacity(64 * 1024, File::open(input)?),
            buf: Vec::new(),
            line: 0,
        })
    }

    pub(super) fn next_row(&mut self) -> Result<Option<(u64, Members)>, PartError> {
        loop {
            self.buf.clear();
            if self.reader.read_until(b'\n', &mut self.buf)? == 0 {
                return Ok(None);
            }
            self.line += 1;
            let line = self.line;
            let mut bytes = &self.buf[..];
            if line == 1 {
                bytes = crate::jsonl::without_bom(bytes);
            }
            let text = std::str::from_utf8(bytes)
                .map_err(|_| PartError::Format(format!("line {line}: not UTF-8")))?
                .trim();
            if text.is_empty() {
                continue;
            }
            return match serde_json::from_str::<JsonRow>(text) {
                Ok(JsonRow::Object(members)) => Ok(Some((line, members))),
                Ok(JsonRow::Other(kind)) => Err(PartError::row(
                    line,
                    None,
                    format!("expected a JSON object, got {kind}"),
                )),
                Err(e) => Err(PartError::row(line, None, format!("invalid JSON: {e}"))),
            };
        }
    }
}

fn jsonl_rows(input: &Path, schema: &[Column], out: &mut PartWriter) -> Result<(), PartError> {
    let index: HashMap<&str, usize> = schema
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let mut lines = JsonLines::open(input)?;
    let mut cells: Vec<Option<Value>> = vec![None; schema.len()];
    while let Some((line, members)) = lines.next_row()? {
        for (key, value) in members {
            let Some(&i) = index.get(key.as_str()) else {
                return Err(PartError::row(
                    line,
                    Some(key.as_str()),
                    "not a column of the dataset",
                ));
            };
            cells[i] = Some(value);
        }
        for ((column, builder), cell) in schema.iter().zip(&mut out.columns).zip(&mut cells) {
            builder
                .append_json(column.ty, cell.take().as_ref())
                .map_err(|m| PartError::row(line, Some(column.name.as_str()), m))?;
        }
        out.rows_done(1)?;
    }
    Ok(())
}

// ---- CSV ----

pub(super) fn csv_reader(input: &Path) -> Result<csv::Reader<CrlfToLf<File>>, PartError> {
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(CrlfToLf::new(File::open(input)?)))
}

/// Reads `\r\n` as `\n`. The csv crate ends a record at the `\r` of a
/// CRLF and counts its `\n` only as part of the next record, so every
/// line number after a CRLF would be one short; RFC 4180 files all end
/// their lines so. (A CRLF inside a quoted cell becomes LF too.)
pub(super) struct CrlfToLf<R> {
    inner: std::io::BufReader<R>,
}

impl<R: std::io::Read> CrlfToLf<R> {
    pub(super) fn new(inner: R) -> Self {
        Self {
            inner: std::io::BufReader::with_capacity(64 * 1024, inner),
        }
    }
}

impl<R: std::io::Read> std::io::Read for CrlfToLf<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::BufRead;
        let mut out = 0;
        while out < buf.len() {
            let available = self.inner.fill_buf()?;
            if available.is_empty() {
                break;
            }
            // Copy up to the next `\r`.
            let take = (buf.len() - out).min(available.len());
            let run = available[..take]
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(take);
            buf[out..out + run].copy_from_slice(&available[..run]);
            out += run;
            self.inner.consume(run);
            if run < take {
                // A `\r`: dropped when a `\n` follows.
                self.inner.consume(1);
                if self.inner.fill_buf()?.first() != Some(&b'\n') {
                    buf[out] = b'\r';
                    out += 1;
                }
            }
        }
        Ok(out)
    }
}

pub(super) fn csv_error(e: csv::Error) -> PartError {
    let message = e.to_string();
    match e.into_kind() {
        csv::ErrorKind::Io(e) => PartError::Io(e),
        csv::ErrorKind::Utf8 { pos, .. } => {
            PartError::Format(format!("line {}: not UTF-8", pos.map_or(0, |p| p.line())))
        }
        csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => PartError::row(
            pos.map_or(0, |p| p.line()),
            None,
            format!("expected {expected_len} cells as in the header, got {len}"),
        ),
        _ => PartError::Format(format!("CSV: {message}")),
    }
}

/// Reads the next record like `csv::Reader::read_record`, with a record
/// whose cells do not match the header and that runs from its line to the
/// end of the file reported as what it almost always is: a quoted cell
/// never closed (the csv crate reads such a cell to the end of the file).
pub(super) fn read_csv_record<R: std::io::Read>(
    reader: &mut csv::Reader<R>,
    record: &mut csv::StringRecord,
) -> Result<bool, PartError> {
    match reader.read_record(record) {
        Ok(more) => Ok(more),
        Err(e) => {
            let start = match e.kind() {
                csv::ErrorKind::UnequalLengths { pos: Some(pos), .. } => Some(pos.line()),
                _ => None,
            };
            // Spanning lines, and nothing after it (the import fails
            // anyway, so reading on costs nothing).
            let spans = |line: u64, reader: &mut csv::Reader<R>| {
                reader.position().line() > line + 1
                    && matches!(reader.read_record(&mut csv::StringRecord::new()), Ok(false))
            };
            match start {
                Some(line) if spans(line, reader) => Err(PartError::row(
                    line,
                    None,
                    "a quoted cell is not closed: it runs to the end of the file".to_string(),
                )),
                _ => Err(csv_error(e)),
            }
        }
    }
}

fn csv_rows(input: &Path, schema: &[Column], out: &mut PartWriter) -> Result<(), PartError> {
    let mut reader = csv_reader(input)?;
    let header = reader.headers().map_err(csv_error)?.clone();
    // The schema column of each CSV column.
    let mut targets = Vec::with_capacity(header.len());
    for name in header.iter() {
        let Some(i) = schema.iter().position(|c| c.name == name) else {
            return Err(PartError::Format(format!(
                "the CSV header names `{name}`, which is not a column of the dataset"
            )));
        };
        if targets.contains(&i) {
            return Err(PartError::Format(format!(
                "the CSV header names `{name}` twice"
            )));
        }
        targets.push(i);
    }
    let absent: Vec<usize> = (0..schema.len()).filter(|i| !targets.contains(i)).collect();
    let mut record = csv::StringRecord::new();
    while read_csv_record(&mut reader, &mut record)? {
        let line = record.position().map_or(0, |p| p.line());
        for (cell, &i) in record.iter().zip(&targets) {
            let column = &schema[i];
            out.columns[i]
                .append_csv(column.ty, cell)
                .map_err(|m| PartError::row(line, Some(column.name.as_str()), m))?;
        }
        for &i in &absent {
            out.columns[i].append_null();
        }
        out.rows_done(1)?;
    }
    Ok(())
}

#[cfg(test)]
mod crlf_tests {
    use std::io::Read;

    use super::CrlfToLf;

    fn through(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut reader = CrlfToLf::new(input);
        let mut out = Vec::new();
        let mut buf = vec![0u8; chunk];
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn crlf_becomes_lf_and_lone_crs_stay() {
        for chunk in [1, 2, 3, 64] {
            assert_eq!(through(b"a,b\r\n1,2\r\n", chunk), b"a,b\n1,2\n");
            assert_eq!(through(b"x\ry\r\r\nz\r", chunk), b"x\ry\r\nz\r");
            assert_eq!(through(b"", chunk), b"");
        }
    }
}
