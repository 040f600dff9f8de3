//! A dataset's schema: named, typed, nullable columns; its checks and its
//! stored form (the API's wire shape, JSON text in the dataset's row).

use std::collections::HashSet;

use serde_json::{json, Value};

/// Most columns a dataset may have.
pub const MAX_COLUMNS: usize = 1000;
/// Longest column name, in bytes.
pub const MAX_COLUMN_NAME_BYTES: usize = 256;

/// A column's type, named on the wire as `string`, `integer`, `float`,
/// `boolean`, `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// A JSON string.
    String,
    /// A JSON integer that fits an i64.
    Integer,
    /// Any JSON number, kept as an f64.
    Float,
    /// JSON `true` or `false`.
    Boolean,
    /// Any JSON value, kept as its (compact) JSON text.
    Json,
}

impl ColumnType {
    pub const ALL: [ColumnType; 5] = [
        ColumnType::String,
        ColumnType::Integer,
        ColumnType::Float,
        ColumnType::Boolean,
        ColumnType::Json,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnType::String => "string",
            ColumnType::Integer => "integer",
            ColumnType::Float => "float",
            ColumnType::Boolean => "boolean",
            ColumnType::Json => "json",
        }
    }

    /// From the wire name (exact, lowercase).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One column of a dataset; every column is nullable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
}

impl Column {
    pub fn new(name: impl Into<String>, ty: ColumnType) -> Self {
        Self {
            name: name.into(),
            ty,
        }
    }
}

/// Checks a schema: 1..=1000 columns, names non-empty, at most 256 bytes,
/// unique. `Err` holds a message naming the column at fault.
pub fn check_schema(columns: &[Column]) -> Result<(), String> {
    if columns.is_empty() {
        return Err("a dataset needs at least one column".into());
    }
    if columns.len() > MAX_COLUMNS {
        return Err(format!(
            "a dataset has at most {MAX_COLUMNS} columns, this schema has {}",
            columns.len()
        ));
    }
    let mut seen = HashSet::with_capacity(columns.len());
    for (i, column) in columns.iter().enumerate() {
        if column.name.is_empty() {
            return Err(format!("column {} has an empty name", i + 1));
        }
        if column.name.len() > MAX_COLUMN_NAME_BYTES {
            return Err(format!(
                "column `{}`: a name has at most {MAX_COLUMN_NAME_BYTES} bytes",
                column.name
            ));
        }
        if !seen.insert(column.name.as_str()) {
            return Err(format!("column `{}` appears twice", column.name));
        }
    }
    Ok(())
}

/// The stored (and wire) form of a schema:
/// `[{"name": "...", "type": {"name": "string"}}, ...]`.
pub fn schema_to_json(columns: &[Column]) -> Value {
    Value::Array(
        columns
            .iter()
            .map(|c| json!({"name": c.name, "type": {"name": c.ty.as_str()}}))
            .collect(),
    )
}

/// Reads the form [`schema_to_json`] writes (other fields of a column are
/// ignored), and checks it with [`check_schema`]. `Err` holds a message naming the column at fault.
pub fn schema_from_json(value: &Value) -> Result<Vec<Column>, String> {
    let items = value.as_array().ok_or("a schema is an array of columns")?;
    let mut columns = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = i + 1;
        let object = item
            .as_object()
            .ok_or_else(|| format!("column {at} is not an object"))?;
        let name = object
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("column {at}: `name` must be a string"))?;
        let type_name = object
            .get("type")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                format!("column `{name}`: `type` must be an object like {{\"name\": \"string\"}}")
            })?;
        let ty = ColumnType::parse(type_name).ok_or_else(|| {
            format!(
                "column `{name}`: unknown type `{type_name}` (one of {})",
                ColumnType::ALL.map(ColumnType::as_str).join(", ")
            )
        })?;
        columns.push(Column::new(name, ty));
    }
    check_schema(&columns)?;
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_round_trip() {
        for ty in ColumnType::ALL {
            assert_eq!(ColumnType::parse(ty.as_str()), Some(ty));
            let wire = serde_json::to_value(ty).unwrap();
            assert_eq!(wire, json!(ty.as_str()));
            assert_eq!(serde_json::from_value::<ColumnType>(wire).unwrap(), ty);
        }
        assert_eq!(ColumnType::parse("String"), None);
        assert_eq!(ColumnType::parse("int"), None);
    }

    #[test]
    fn schema_json_round_trips() {
        let columns: Vec<Column> = ColumnType::ALL
            .iter()
            .map(|&ty| Column::new(format!("c_{ty}"), ty))
            .collect();
        let value = schema_to_json(&columns);
        assert_eq!(
            value[0],
            json!({"name": "c_string", "type": {"name": "string"}})
        );
        assert_eq!(value[4]["type"]["name"], "json");
        assert_eq!(schema_from_json(&value).unwrap(), columns);
        let text = serde_json::to_string(&value).unwrap();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(schema_from_json(&parsed).unwrap(), columns);
    }

    #[test]
    fn bad_schemas_are_named() {
        let err = |v: Value| schema_from_json(&v).unwrap_err();
        assert!(err(json!({})).contains("array"));
        assert!(err(json!([])).contains("at least one"));
        assert!(err(json!([1])).contains("column 1"));
        assert!(err(json!([{"name": "a"}])).contains("`a`"));
        let e = err(json!([{"name": "a", "type": {"name": "date"}}]));
        assert!(e.contains("`a`") && e.contains("`date`"), "{e}");
        let e = err(json!([
            {"name": "a", "type": {"name": "string"}},
            {"name": "a", "type": {"name": "integer"}}
        ]));
        assert!(e.contains("`a` appears twice"), "{e}");
    }

    #[test]
    fn check_schema_limits() {
        assert!(check_schema(&[]).is_err());
        assert!(check_schema(&[Column::new("", ColumnType::String)])
            .unwrap_err()
            .contains("column 1"));
        let long = "x".repeat(MAX_COLUMN_NAME_BYTES + 1);
        assert!(
            check_schema(&[Column::new(long.clone(), ColumnType::String)])
                .unwrap_err()
                .contains(&long)
        );
        let max = "é".repeat(MAX_COLUMN_NAME_BYTES / 2);
        assert!(check_schema(&[Column::new(max, ColumnType::String)]).is_ok());
        let many: Vec<Column> = (0..MAX_COLUMNS)
            .map(|i| Column::new(format!("c{i}"), ColumnType::Integer))
            .collect();
        assert!(check_schema(&many).is_ok());
        let mut too_many = many;
        too_many.push(Column::new("extra", ColumnType::Integer));
        assert!(check_schema(&too_many).unwrap_err().contains("1000"));
    }
}
