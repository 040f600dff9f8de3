//! Parquet parts in: their Arrow columns matched to the schema by name,
//! any integer width for `integer`, float32/64 for `float`, strings for
//! `string` and `json` (the JSON text checked), read batch by batch.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType};
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use serde_json::Value;

use super::convert::PartWriter;
use super::values::ColumnBuilder;
use super::PartError;
use crate::datasets::schema::{Column, ColumnType};

/// Rows per batch read from a Parquet part.
const PARQUET_BATCH_ROWS: usize = 8192;

/// A Parquet part, its Arrow types read from the Parquet schema alone (an
/// embedded Arrow schema's dictionaries, large and view strings come back
/// as plain Utf8).
pub(super) fn open_parquet(
    input: &Path,
) -> Result<ParquetRecordBatchReaderBuilder<File>, PartError> {
    let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
    ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(input)?, options)
        .map_err(|e| PartError::Format(format!("not a readable Parquet file: {e}")))
}

/// Whether a Parquet part's column of type `data_type` fits a `ty` column.
pub(super) fn fits(ty: ColumnType, data_type: &DataType) -> bool {
    match ty {
        ColumnType::Integer => data_type.is_integer(),
        ColumnType::Float => matches!(data_type, DataType::Float32 | DataType::Float64),
        ColumnType::Boolean => matches!(data_type, DataType::Boolean),
        ColumnType::String | ColumnType::Json => matches!(
            data_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ),
    }
}

/// The part's column feeding each schema column (none: all null); an error
/// for a column the schema lacks, a column twice, or one of a type that
/// does not fit.
fn parquet_plan(part: &Schema, schema: &[Column]) -> Result<Vec<Option<usize>>, PartError> {
    let mut seen = HashSet::new();
    let mut extra = Vec::new();
    for field in part.fields() {
        if !seen.insert(field.name().as_str()) {
            return Err(PartError::Format(format!(
                "the Parquet part has two columns named `{}`",
                field.name()
            )));
        }
        if !schema.iter().any(|c| c.name == *field.name()) {
            extra.push(format!("`{}`", field.name()));
        }
    }
    if !extra.is_empty() {
        return Err(PartError::Format(format!(
            "the Parquet part has columns that are not in the dataset: {}",
            extra.join(", ")
        )));
    }
    schema
        .iter()
        .map(|column| {
            let Ok(i) = part.index_of(&column.name) else {
                return Ok(None);
            };
            let data_type = part.field(i).data_type();
            if fits(column.ty, data_type) {
                Ok(Some(i))
            } else {
                Err(PartError::Format(format!(
                    "column `{}` is {data_type} in the Parquet part, which does not fit the dataset's type {}",
                    column.name, column.ty
                )))
            }
        })
        .collect()
}

pub(super) fn parquet_rows(
    input: &Path,
    schema: &[Column],
    out: &mut PartWriter,
) -> Result<(), PartError> {
    let builder = open_parquet(input)?;
    let plan = parquet_plan(builder.schema(), schema)?;
    let reader = builder
        .with_batch_size(PARQUET_BATCH_ROWS)
        .build()
        .map_err(|e| PartError::Format(format!("the Parquet part does not read: {e}")))?;
    let mut first_row = 0u64;
    for batch in reader {
        let batch =
            batch.map_err(|e| PartError::Format(format!("the Parquet part does not read: {e}")))?;
        let mut start = 0;
        while start < batch.num_rows() {
            let n = (batch.num_rows() - start).min(out.room());
            let slice = batch.slice(start, n);
            // Column by column; the error reported is the earliest row's.
            let mut error: Option<(usize, &str, String)> = None;
            for ((column, builder), source) in schema.iter().zip(&mut out.columns).zip(&plan) {
                let result = match source {
                    Some(i) => append_array(builder, column.ty, slice.column(*i).as_ref()),
                    None => {
                        (0..n).for_each(|_| builder.append_null());
                        Ok(())
                    }
                };
                if let Err((row, message)) = result {
                    if error.as_ref().is_none_or(|(r, _, _)| row < *r) {
                        error = Some((row, column.name.as_str(), message));
                    }
                }
            }
            if let Some((row, name, message)) = error {
                let line = first_row + (start + row) as u64 + 1;
                return Err(PartError::row(line, Some(name), message));
            }
            out.rows_done(n)?;
            start += n;
        }
        first_row += batch.num_rows() as u64;
    }
    Ok(())
}

/// Appends an input column (of a type [`fits`] accepted); `Err` holds the
/// 0-based row at fault and what is wrong.
fn append_array(
    b: &mut ColumnBuilder,
    ty: ColumnType,
    array: &dyn Array,
) -> Result<(), (usize, String)> {
    match ty {
        ColumnType::Integer => match array.data_type() {
            DataType::Int8 => ints::<Int8Type>(b, array),
            DataType::Int16 => ints::<Int16Type>(b, array),
            DataType::Int32 => ints::<Int32Type>(b, array),
            DataType::Int64 => ints::<Int64Type>(b, array),
            DataType::UInt8 => ints::<UInt8Type>(b, array),
            DataType::UInt16 => ints::<UInt16Type>(b, array),
            DataType::UInt32 => ints::<UInt32Type>(b, array),
            DataType::UInt64 => ints::<UInt64Type>(b, array),
            other => Err((0, format!("{other} is not an integer type"))),
        },
        ColumnType::Float => match array.data_type() {
            DataType::Float32 => floats::<Float32Type>(b, array),
            DataType::Float64 => floats::<Float64Type>(b, array),
            other => Err((0, format!("{other} is not a float type"))),
        },
        ColumnType::Boolean => {
            for value in array.as_boolean().iter() {
                match value {
                    Some(v) => b.append_bool(v),
                    None => b.append_null(),
                }
            }
            Ok(())
        }
        ColumnType::String | ColumnType::Json => {
            let texts: Box<dyn Iterator<Item = Option<&str>>> = match array.data_type() {
                DataType::Utf8 => Box::new(array.as_string::<i32>().iter()),
                DataType::LargeUtf8 => Box::new(array.as_string::<i64>().iter()),
                DataType::Utf8View => Box::new(array.as_string_view().iter()),
                other => return Err((0, format!("{other} is not a string type"))),
            };
            for (row, text) in texts.enumerate() {
                match text {
                    None => b.append_null(),
                    Some(text) if ty == ColumnType::String => b.append_text(text),
                    Some(text) => {
                        let value: Value = serde_json::from_str(text)
                            .map_err(|e| (row, format!("invalid JSON: {e}")))?;
                        if value.is_null() {
                            b.append_null();
                        } else {
                            b.append_text(&value.to_string());
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

fn ints<T: ArrowPrimitiveType>(
    b: &mut ColumnBuilder,
    array: &dyn Array,
) -> Result<(), (usize, String)>
where
    T::Native: TryInto<i64> + fmt::Display,
{
    for (row, value) in array.as_primitive::<T>().iter().enumerate() {
        match value {
            None => b.append_null(),
            Some(v) => match v.try_into() {
                Ok(i) => b.append_i64(i),
                Err(_) => return Err((row, format!("{v} does not fit a 64-bit integer"))),
            },
        }
    }
    Ok(())
}

fn floats<T: ArrowPrimitiveType>(
    b: &mut ColumnBuilder,
    array: &dyn Array,
) -> Result<(), (usize, String)>
where
    T::Native: Into<f64>,
{
    for (row, value) in array.as_primitive::<T>().iter().enumerate() {
        match value.map(Into::into) {
            None => b.append_null(),
            Some(f) if f.is_finite() => b.append_f64(f),
            Some(f) => return Err((row, format!("{f} is not a finite number"))),
        }
    }
    Ok(())
}
