//! A dataset's rows as Parquet: parts uploaded as JSON Lines, CSV or
//! Parquet are checked against the schema and rewritten as Parquet
//! ([`convert_part`], sync, for the blocking pool), then read back from the
//! blob store by range ([`read_rows`], [`export`]).
//!
//! The stored form: one Arrow column per schema column, all nullable —
//! `string` Utf8, `integer` Int64, `float` Float64, `boolean` Boolean, `json`
//! Utf8 holding compact JSON text — each field's metadata naming its type
//! under [`TYPE_KEY`]; row groups of [`ROW_GROUP_ROWS`] rows; snappy.

mod convert;
mod export;
mod from_parquet;
mod infer;
mod read;
mod values;

#[cfg(test)]
mod tests;

pub use convert::convert_part;
pub use export::{export, ExportFormat};
pub use infer::infer_schema;
pub use read::{read_rows, BlobFile, PartRef};

/// Rows per Parquet row group.
pub const ROW_GROUP_ROWS: usize = 65_536;

/// The Arrow field metadata key naming a column's type (`string`, ...).
pub const TYPE_KEY: &str = "hearth.type";

/// Rows a part has before a schema is inferred from it.
pub const INFER_ROWS: usize = 1000;

/// The format of an uploaded part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartFormat {
    Jsonl,
    Csv,
    Parquet,
}

impl PartFormat {
    /// `jsonl`, `csv` or `parquet`.
    pub fn as_str(self) -> &'static str {
        match self {
            PartFormat::Jsonl => "jsonl",
            PartFormat::Csv => "csv",
            PartFormat::Parquet => "parquet",
        }
    }

    /// The format named `jsonl`, `csv` or `parquet`.
    pub fn parse(name: &str) -> Option<Self> {
        [PartFormat::Jsonl, PartFormat::Csv, PartFormat::Parquet]
            .into_iter()
            .find(|f| f.as_str() == name)
    }

    /// From a content type (`application/jsonl`, `application/x-ndjson`,
    /// `application/json`, `text/csv`, `application/vnd.apache.parquet`,
    /// `application/x-parquet`; `application/octet-stream` and others are
    /// unknown) and/or a file name's extension (`.jsonl`, `.ndjson`,
    /// `.json`, `.csv`, `.parquet`): a known type wins, else the name;
    /// JSON Lines when neither tells.
    pub fn detect(content_type: Option<&str>, file_name: Option<&str>) -> PartFormat {
        let from_type = content_type.and_then(|t| {
            let essence = t.split(';').next().unwrap_or("").trim();
            match essence.to_ascii_lowercase().as_str() {
                "application/jsonl"
                | "application/x-jsonl"
                | "application/jsonlines"
                | "application/x-jsonlines"
                | "application/x-ndjson"
                | "application/ndjson"
                | "application/json" => Some(PartFormat::Jsonl),
                "text/csv" | "application/csv" => Some(PartFormat::Csv),
                "application/vnd.apache.parquet" | "application/x-parquet" => {
                    Some(PartFormat::Parquet)
                }
                _ => None,
            }
        });
        let from_name = file_name.and_then(|name| {
            let (_, ext) = name.rsplit_once('.')?;
            match ext.to_ascii_lowercase().as_str() {
                "jsonl" | "ndjson" | "json" => Some(PartFormat::Jsonl),
                "csv" => Some(PartFormat::Csv),
                "parquet" | "pq" => Some(PartFormat::Parquet),
                _ => None,
            }
        });
        from_type.or(from_name).unwrap_or(PartFormat::Jsonl)
    }
}

/// What a converted part holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartStats {
    /// Rows in the part.
    pub rows: u64,
    /// Bytes of the Parquet file written.
    pub bytes: u64,
}

/// Why a part could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// A row breaks the schema: 1-based line of the part (for CSV the header
    /// is line 1, so the first data row is line 2, and a row whose quoted
    /// cells span lines has the line it starts on; for Parquet the 1-based
    /// row number), the column if one is at fault, and what is wrong.
    #[error("line {line}{}: {message}", column.as_ref().map(|c| format!(", column `{c}`")).unwrap_or_default())]
    Row {
        line: u64,
        column: Option<String>,
        message: String,
    },
    /// The part as a whole is unreadable (not UTF-8, bad CSV header, not
    /// Parquet, a Parquet column of the wrong type, a CSV header naming a
    /// column not in the schema...).
    #[error("{0}")]
    Format(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl PartError {
    fn row(line: u64, column: Option<&str>, message: impl Into<String>) -> Self {
        PartError::Row {
            line,
            column: column.map(str::to_string),
            message: message.into(),
        }
    }
}

/// A Parquet or Arrow error met while reading or writing stored parts.
fn table_error(e: impl std::fmt::Display) -> crate::StoreError {
    crate::StoreError::Table(e.to_string())
}
