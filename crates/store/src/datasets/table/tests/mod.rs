//! Tests of the table layer: fixtures here, the tests by theme beside.

mod convert;
mod read;

use std::path::{Path, PathBuf};

use arrow_array::{ArrayRef, RecordBatch};
use futures_util::TryStreamExt;
use parquet::arrow::ArrowWriter;
use serde_json::{json, Map, Value};

use super::{convert_part, export, read_rows, ExportFormat, PartError, PartFormat, PartRef};
use crate::datasets::schema::{Column, ColumnType};
use crate::Blobs;

pub(super) struct Fixture {
    pub(super) dir: tempfile::TempDir,
    pub(super) blobs: Blobs,
}

pub(super) fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let blobs = Blobs::local(&dir.path().join("blobs")).unwrap();
    Fixture { dir, blobs }
}

impl Fixture {
    pub(super) fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Converts `input` and stores it as a blob, as the server does.
    pub(super) async fn store(
        &self,
        name: &str,
        input: &Path,
        format: PartFormat,
        schema: &[Column],
    ) -> PartRef {
        let output = self.dir.path().join(format!("{name}.out.parquet"));
        let stats = convert_part(input, format, schema, &output).unwrap();
        assert_eq!(stats.bytes, std::fs::metadata(&output).unwrap().len());
        let key = format!("datasets/ds-test/{name}.parquet");
        let written = self.blobs.put_file(&key, &output).await.unwrap();
        assert_eq!(written, stats.bytes);
        PartRef {
            key,
            rows: stats.rows,
        }
    }

    pub(super) async fn store_bytes(
        &self,
        name: &str,
        bytes: &[u8],
        format: PartFormat,
        schema: &[Column],
    ) -> PartRef {
        let input = self.file(name, bytes);
        self.store(name, &input, format, schema).await
    }

    pub(super) fn convert_err(
        &self,
        name: &str,
        bytes: &[u8],
        format: PartFormat,
        schema: &[Column],
    ) -> PartError {
        let input = self.file(name, bytes);
        let output = self.dir.path().join(format!("{name}.out.parquet"));
        convert_part(&input, format, schema, &output).unwrap_err()
    }
}

pub(super) fn five() -> Vec<Column> {
    vec![
        Column::new("s", ColumnType::String),
        Column::new("i", ColumnType::Integer),
        Column::new("f", ColumnType::Float),
        Column::new("b", ColumnType::Boolean),
        Column::new("j", ColumnType::Json),
    ]
}

/// Rows of the five types as read back (every column present).
pub(super) fn sample() -> Vec<Map<String, Value>> {
    let rows = [
        json!({"s": "héllo, \"wörld\"\nnext line", "i": -12, "f": 1.5, "b": true,
               "j": {"a": [1, 2, {"b": null}], "c": "x,y"}}),
        json!({"s": null, "i": i64::MAX, "f": -0.25, "b": false, "j": [1, "two", 3.5]}),
        json!({"s": null, "i": null, "f": null, "b": null, "j": null}),
        json!({"s": "日本語 🎉 'quotes'", "i": i64::MIN, "f": 3.0, "b": null, "j": "just a string"}),
        json!({"s": " padded ", "i": 0, "f": 1e300, "b": true, "j": 42}),
    ];
    rows.into_iter()
        .map(|r| r.as_object().unwrap().clone())
        .collect()
}

pub(super) fn jsonl_of(rows: &[Map<String, Value>]) -> Vec<u8> {
    let mut out = Vec::new();
    for row in rows {
        // Nulls left out: a missing key is null too.
        let row: Map<String, Value> = row
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_json::to_writer(&mut out, &row).unwrap();
        out.extend_from_slice(b"\n\n");
    }
    out
}

pub(super) fn csv_of(schema: &[Column], rows: &[Map<String, Value>]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer
        .write_record(schema.iter().map(|c| c.name.as_str()))
        .unwrap();
    for row in rows {
        writer
            .write_record(schema.iter().map(|c| match (&row[&c.name], c.ty) {
                (Value::Null, _) => String::new(),
                (Value::String(s), ColumnType::String) => s.clone(),
                (Value::Bool(true), _) => "TRUE".into(),
                (v, _) => v.to_string(),
            }))
            .unwrap();
    }
    writer.into_inner().unwrap()
}

/// A CSV cell of an export as JSON, the way its column's type reads.
pub(super) fn csv_cell(ty: ColumnType, cell: &str) -> Value {
    match (ty, cell) {
        (_, "") => Value::Null,
        (ColumnType::String, s) => Value::String(s.to_string()),
        (ColumnType::Integer, s) => Value::from(s.parse::<i64>().unwrap()),
        (ColumnType::Float, s) => Value::from(s.parse::<f64>().unwrap()),
        (ColumnType::Boolean, s) => Value::Bool(s.parse().unwrap()),
        (ColumnType::Json, s) => serde_json::from_str(s).unwrap(),
    }
}

pub(super) async fn read_all(
    fx: &Fixture,
    parts: &[PartRef],
    schema: &[Column],
) -> Vec<Map<String, Value>> {
    read_rows(&fx.blobs, parts, schema, 0, usize::MAX)
        .await
        .unwrap()
}

pub(super) async fn export_bytes(
    fx: &Fixture,
    parts: &[PartRef],
    schema: &[Column],
    columns: &[&str],
    format: ExportFormat,
    limit: Option<u64>,
) -> Vec<Vec<u8>> {
    let columns = columns.iter().map(|c| c.to_string()).collect();
    export(
        fx.blobs.clone(),
        parts.to_vec(),
        schema.to_vec(),
        columns,
        format,
        limit,
    )
    .map_ok(|b| b.to_vec())
    .try_collect()
    .await
    .unwrap()
}

pub(super) fn parquet_file(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}
