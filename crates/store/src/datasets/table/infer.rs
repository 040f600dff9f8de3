//! Schemas inferred from a part's first rows, for imports without one.

use std::collections::HashMap;
use std::path::Path;

use arrow_schema::DataType;
use serde_json::Value;

use super::convert::{csv_error, csv_reader, read_csv_record, JsonLines};
use super::from_parquet::{fits, open_parquet};
use super::values::{parse_csv_bool, parse_csv_float, parse_csv_integer};
use super::{PartError, PartFormat, INFER_ROWS, TYPE_KEY};
use crate::datasets::schema::{check_schema, Column, ColumnType};

/// Infers a schema from the first (up to [`INFER_ROWS`]) rows of a part.
/// JSON Lines: the keys in first-seen order; a key whose values are all
/// integers is `integer`, all numbers `float`, all booleans `boolean`, all
/// strings `string`, objects, arrays or a mix `json` (nulls are ignored; a
/// key never anything but null is `string`). CSV: the header's columns; one
/// whose non-empty cells all parse as an i64 is `integer`, as a number
/// `float`, as `true`/`false` `boolean`, else `string`. Parquet: from its
/// Arrow schema (strings `string`, or `json` where the part says so in its
/// field metadata, any integer `integer`, floats `float`, booleans
/// `boolean`; another type is an error). The result passes
/// [`check_schema`] (else [`PartError::Format`]).
pub fn infer_schema(input: &Path, format: PartFormat) -> Result<Vec<Column>, PartError> {
    let columns = match format {
        PartFormat::Jsonl => infer_jsonl(input)?,
        PartFormat::Csv => infer_csv(input)?,
        PartFormat::Parquet => infer_parquet(input)?,
    };
    check_schema(&columns).map_err(|e| PartError::Format(format!("the inferred schema: {e}")))?;
    Ok(columns)
}

/// The kinds of value a JSON key was seen with.
#[derive(Default)]
struct Seen {
    integer: bool,
    float: bool,
    boolean: bool,
    string: bool,
    other: bool,
}

impl Seen {
    fn add(&mut self, value: &Value) {
        match value {
            Value::Null => {}
            Value::Number(n) if n.is_i64() => self.integer = true,
            Value::Number(_) => self.float = true,
            Value::Bool(_) => self.boolean = true,
            Value::String(_) => self.string = true,
            Value::Array(_) | Value::Object(_) => self.other = true,
        }
    }

    fn column_type(&self) -> ColumnType {
        let number = self.integer || self.float;
        match (number, self.boolean, self.string, self.other) {
            (false, false, false, false) => ColumnType::String,
            (true, false, false, false) if self.float => ColumnType::Float,
            (true, false, false, false) => ColumnType::Integer,
            (false, true, false, false) => ColumnType::Boolean,
            (false, false, true, false) => ColumnType::String,
            _ => ColumnType::Json,
        }
    }
}

fn infer_jsonl(input: &Path) -> Result<Vec<Column>, PartError> {
    let mut lines = JsonLines::open(input)?;
    let mut keys: Vec<(String, Seen)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut rows = 0;
    while rows < INFER_ROWS {
        let Some((_, members)) = lines.next_row()? else {
            break;
        };
        rows += 1;
        for (key, value) in members {
            let i = match index.get(&key) {
                Some(&i) => i,
                None => {
                    index.insert(key.clone(), keys.len());
                    keys.push((key, Seen::default()));
                    keys.len() - 1
                }
            };
            keys[i].1.add(&value);
        }
    }
    Ok(keys
        .into_iter()
        .map(|(name, seen)| Column::new(name, seen.column_type()))
        .collect())
}

fn infer_csv(input: &Path) -> Result<Vec<Column>, PartError> {
    let mut reader = csv_reader(input)?;
    let header = reader.headers().map_err(csv_error)?.clone();
    // Per column: (any non-empty cell, all integers, all numbers, all booleans).
    let mut seen = vec![(false, true, true, true); header.len()];
    let mut record = csv::StringRecord::new();
    let mut rows = 0;
    while rows < INFER_ROWS && read_csv_record(&mut reader, &mut record)? {
        rows += 1;
        for (cell, (any, integer, float, boolean)) in record.iter().zip(&mut seen) {
            if cell.is_empty() {
                continue;
            }
            *any = true;
            *integer &= parse_csv_integer(cell).is_some();
            *float &= parse_csv_float(cell).is_some();
            *boolean &= parse_csv_bool(cell).is_some();
        }
    }
    Ok(header
        .iter()
        .zip(seen)
        .map(|(name, (any, integer, float, boolean))| {
            let ty = match (any, integer, float, boolean) {
                (false, ..) => ColumnType::String,
                (true, true, _, _) => ColumnType::Integer,
                (true, false, true, _) => ColumnType::Float,
                (true, false, false, true) => ColumnType::Boolean,
                _ => ColumnType::String,
            };
            Column::new(name, ty)
        })
        .collect())
}

fn infer_parquet(input: &Path) -> Result<Vec<Column>, PartError> {
    let builder = open_parquet(input)?;
    // The types named in an embedded Arrow schema's field metadata (a
    // part stored by Hearth says which strings are JSON).
    let file = builder.metadata().file_metadata();
    let named: HashMap<String, ColumnType> =
        parquet::arrow::parquet_to_arrow_schema(file.schema_descr(), file.key_value_metadata())
            .map(|schema| {
                schema
                    .fields()
                    .iter()
                    .filter_map(|f| {
                        let ty = ColumnType::parse(f.metadata().get(TYPE_KEY)?)?;
                        Some((f.name().clone(), ty))
                    })
                    .collect()
            })
            .unwrap_or_default();
    builder
        .schema()
        .fields()
        .iter()
        .map(|field| {
            let data_type = field.data_type();
            let ty = match named.get(field.name()) {
                Some(&ty) if fits(ty, data_type) => ty,
                _ => match data_type {
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
                    DataType::Float32 | DataType::Float64 => ColumnType::Float,
                    DataType::Boolean => ColumnType::Boolean,
                    t if t.is_integer() => ColumnType::Integer,
                    other => {
                        return Err(PartError::Format(format!(
                            "column `{}` is {other} in the Parquet part, which has no dataset type",
                            field.name()
                        )))
                    }
                },
            };
            Ok(Column::new(field.name().as_str(), ty))
        })
        .collect()
}
