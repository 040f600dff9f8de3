//! Cells: JSON and CSV values into Arrow builders (checked against the
//! column's type), and stored Arrow cells back out as JSON or text.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde_json::Value;

use super::TYPE_KEY;
use crate::datasets::schema::{Column, ColumnType};
use crate::StoreError;

/// The Arrow type a column is stored as.
pub(super) fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::String | ColumnType::Json => DataType::Utf8,
        ColumnType::Integer => DataType::Int64,
        ColumnType::Float => DataType::Float64,
        ColumnType::Boolean => DataType::Boolean,
    }
}

/// The Arrow schema of stored parts: every column nullable, its type named
/// in the field metadata.
pub(super) fn arrow_schema(schema: &[Column]) -> SchemaRef {
    let fields: Vec<Field> = schema
        .iter()
        .map(|c| {
            Field::new(&c.name, arrow_type(c.ty), true).with_metadata(HashMap::from([(
                TYPE_KEY.to_string(),
                c.ty.as_str().to_string(),
            )]))
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// What a JSON value is, for messages.
pub(super) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One column of a row group in the making.
pub(super) enum ColumnBuilder {
    /// `string`, and `json` as compact JSON text.
    Text(StringBuilder),
    Integer(Int64Builder),
    Float(Float64Builder),
    Boolean(BooleanBuilder),
}

impl ColumnBuilder {
    pub(super) fn new(ty: ColumnType, rows: usize) -> Self {
        match ty {
            ColumnType::String | ColumnType::Json => {
                ColumnBuilder::Text(StringBuilder::with_capacity(rows, rows * 8))
            }
            ColumnType::Integer => ColumnBuilder::Integer(Int64Builder::with_capacity(rows)),
            ColumnType::Float => ColumnBuilder::Float(Float64Builder::with_capacity(rows)),
            ColumnType::Boolean => ColumnBuilder::Boolean(BooleanBuilder::with_capacity(rows)),
        }
    }

    pub(super) fn append_null(&mut self) {
        match self {
            ColumnBuilder::Text(b) => b.append_null(),
            ColumnBuilder::Integer(b) => b.append_null(),
            ColumnBuilder::Float(b) => b.append_null(),
            ColumnBuilder::Boolean(b) => b.append_null(),
        }
    }

    pub(super) fn append_text(&mut self, value: &str) {
        match self {
            ColumnBuilder::Text(b) => b.append_value(value),
            _ => unreachable!("text into a non-text column"),
        }
    }

    pub(super) fn append_i64(&mut self, value: i64) {
        match self {
            ColumnBuilder::Integer(b) => b.append_value(value),
            _ => unreachable!("an integer into a non-integer column"),
        }
    }

    pub(super) fn append_f64(&mut self, value: f64) {
        match self {
            ColumnBuilder::Float(b) => b.append_value(value),
            _ => unreachable!("a float into a non-float column"),
        }
    }

    pub(super) fn append_bool(&mut self, value: bool) {
        match self {
            ColumnBuilder::Boolean(b) => b.append_value(value),
            _ => unreachable!("a boolean into a non-boolean column"),
        }
    }

    /// Appends a JSON row's value (`None`: the key is missing), checked
    /// against `ty`; `Err` says what is wrong.
    pub(super) fn append_json(
        &mut self,
        ty: ColumnType,
        value: Option<&Value>,
    ) -> Result<(), String> {
        let value = match value {
            None | Some(Value::Null) => {
                self.append_null();
                return Ok(());
            }
            Some(value) => value,
        };
        match (ty, value) {
            (ColumnType::Json, value) => self.append_text(&value.to_string()),
            (ColumnType::String, Value::String(s)) => self.append_text(s),
            (ColumnType::Integer, Value::Number(n)) => match n.as_i64() {
                Some(i) => self.append_i64(i),
                None if n.is_u64() => return Err(format!("{n} does not fit a 64-bit integer")),
                None => return Err(format!("expected an integer, got {n}")),
            },
            (ColumnType::Float, Value::Number(n)) => match n.as_f64() {
                Some(f) => self.append_f64(f),
                None => return Err(format!("{n} is not a 64-bit float")),
            },
            (ColumnType::Boolean, Value::Bool(b)) => self.append_bool(*b),
            (ty, value) => {
                return Err(format!(
                    "expected {}, got {}",
                    ty_phrase(ty),
                    json_kind(value)
                ))
            }
        }
        Ok(())
    }

    /// Appends a CSV cell (empty: null), parsed as `ty`; `Err` says what is
    /// wrong.
    pub(super) fn append_csv(&mut self, ty: ColumnType, cell: &str) -> Result<(), String> {
        if cell.is_empty() {
            self.append_null();
            return Ok(());
        }
        match ty {
            ColumnType::String => self.append_text(cell),
            ColumnType::Integer => self.append_i64(
                parse_csv_integer(cell)
                    .ok_or_else(|| format!("expected an integer, got `{}`", clip(cell)))?,
            ),
            ColumnType::Float => self.append_f64(
                parse_csv_float(cell)
                    .ok_or_else(|| format!("expected a number, got `{}`", clip(cell)))?,
            ),
            ColumnType::Boolean => self.append_bool(
                parse_csv_bool(cell)
                    .ok_or_else(|| format!("expected `true` or `false`, got `{}`", clip(cell)))?,
            ),
            ColumnType::Json => {
                let value: Value =
                    serde_json::from_str(cell).map_err(|e| format!("invalid JSON: {e}"))?;
                if value.is_null() {
                    self.append_null();
                } else {
                    self.append_text(&value.to_string());
                }
            }
        }
        Ok(())
    }

    pub(super) fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Text(b) => Arc::new(b.finish()),
            ColumnBuilder::Integer(b) => Arc::new(b.finish()),
            ColumnBuilder::Float(b) => Arc::new(b.finish()),
            ColumnBuilder::Boolean(b) => Arc::new(b.finish()),
        }
    }
}

/// "an integer", ... for messages.
pub(super) fn ty_phrase(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::String => "a string",
        ColumnType::Integer => "an integer",
        ColumnType::Float => "a number",
        ColumnType::Boolean => "a boolean",
        ColumnType::Json => "JSON",
    }
}

/// A cell cut to a readable length for a message.
fn clip(cell: &str) -> String {
    const MAX: usize = 64;
    if cell.len() <= MAX {
        return cell.to_string();
    }
    let mut end = MAX;
    while !cell.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &cell[..end])
}

pub(super) fn parse_csv_integer(cell: &str) -> Option<i64> {
    cell.trim().parse().ok()
}

/// A finite decimal number (no `inf`, no `NaN`: JSON has neither).
pub(super) fn parse_csv_float(cell: &str) -> Option<f64> {
    cell.trim().parse::<f64>().ok().filter(|f| f.is_finite())
}

pub(super) fn parse_csv_bool(cell: &str) -> Option<bool> {
    let cell = cell.trim();
    if cell.eq_ignore_ascii_case("true") {
        Some(true)
    } else if cell.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// A stored column found with another Arrow type than its schema type.
fn mismatch(name: &str, ty: ColumnType, array: &dyn Array) -> StoreError {
    StoreError::Table(format!(
        "column `{name}` ({ty}) is stored as {}",
        array.data_type()
    ))
}

/// A stored cell as JSON: `json` text parsed back, NaN (never written) as
/// null.
pub(super) fn cell_json(
    name: &str,
    ty: ColumnType,
    array: &dyn Array,
    row: usize,
) -> Result<Value, StoreError> {
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match ty {
        ColumnType::String => Value::String(text(name, ty, array, row)?.to_string()),
        ColumnType::Json => serde_json::from_str(text(name, ty, array, row)?).map_err(|e| {
            StoreError::Table(format!("column `{name}`: stored JSON does not parse: {e}"))
        })?,
        ColumnType::Integer => Value::from(integer(name, ty, array, row)?),
        ColumnType::Float => serde_json::Number::from_f64(float(name, ty, array, row)?)
            .map_or(Value::Null, Value::Number),
        ColumnType::Boolean => Value::Bool(boolean(name, ty, array, row)?),
    })
}

/// Writes a stored cell as JSON text (`null` for null).
pub(super) fn write_cell_json(
    out: &mut Vec<u8>,
    name: &str,
    ty: ColumnType,
    array: &dyn Array,
    row: usize,
) -> Result<(), StoreError> {
    if array.is_null(row) {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match ty {
        ColumnType::String => serde_json::to_writer(&mut *out, text(name, ty, array, row)?)
            .map_err(super::table_error)?,
        // Re-serialised rather than copied: the output stays one line a row
        // whatever the stored text.
        ColumnType::Json => {
            let value = cell_json(name, ty, array, row)?;
            serde_json::to_writer(&mut *out, &value).map_err(super::table_error)?
        }
        ColumnType::Integer => {
            out.extend_from_slice(integer(name, ty, array, row)?.to_string().as_bytes())
        }
        ColumnType::Float => match serde_json::Number::from_f64(float(name, ty, array, row)?) {
            Some(n) => out.extend_from_slice(n.to_string().as_bytes()),
            None => out.extend_from_slice(b"null"),
        },
        ColumnType::Boolean => out.extend_from_slice(if boolean(name, ty, array, row)? {
            b"true"
        } else {
            b"false"
        }),
    }
    Ok(())
}

/// A stored cell as a CSV field's text (empty for null; `json` as its JSON
/// text; floats as JSON writes them).
pub(super) fn cell_text<'a>(
    name: &str,
    ty: ColumnType,
    array: &'a dyn Array,
    row: usize,
) -> Result<std::borrow::Cow<'a, str>, StoreError> {
    use std::borrow::Cow;
    if array.is_null(row) {
        return Ok(Cow::Borrowed(""));
    }
    Ok(match ty {
        ColumnType::String | ColumnType::Json => Cow::Borrowed(text(name, ty, array, row)?),
        ColumnType::Integer => Cow::Owned(integer(name, ty, array, row)?.to_string()),
        ColumnType::Float => Cow::Owned(
            serde_json::Number::from_f64(float(name, ty, array, row)?)
                .map(|n| n.to_string())
                .unwrap_or_default(),
        ),
        ColumnType::Boolean => Cow::Borrowed(if boolean(name, ty, array, row)? {
            "true"
        } else {
            "false"
        }),
    })
}

fn text<'a>(
    name: &str,
    ty: ColumnType,
    array: &'a dyn Array,
    row: usize,
) -> Result<&'a str, StoreError> {
    match array.data_type() {
        DataType::Utf8 => Ok(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Ok(array.as_string::<i64>().value(row)),
        DataType::Utf8View => Ok(array.as_string_view().value(row)),
        _ => Err(mismatch(name, ty, array)),
    }
}

fn integer(name: &str, ty: ColumnType, array: &dyn Array, row: usize) -> Result<i64, StoreError> {
    array
        .as_primitive_opt::<Int64Type>()
        .map(|a| a.value(row))
        .ok_or_else(|| mismatch(name, ty, array))
}

fn float(name: &str, ty: ColumnType, array: &dyn Array, row: usize) -> Result<f64, StoreError> {
    array
        .as_primitive_opt::<Float64Type>()
        .map(|a| a.value(row))
        .ok_or_else(|| mismatch(name, ty, array))
}

fn boolean(name: &str, ty: ColumnType, array: &dyn Array, row: usize) -> Result<bool, StoreError> {
    array
        .as_boolean_opt()
        .map(|a| a.value(row))
        .ok_or_else(|| mismatch(name, ty, array))
}
