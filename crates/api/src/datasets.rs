//! `/v1/datasets` wire types: the dataset object, its list and queries,
//! content pages and export queries, patch and creation bodies, and the
//! multipart upload record.
//!
//! A schema on the wire is the spec's list of
//! `{name, type: {name}}` with type names `string`, `integer`, `float`,
//! `boolean` and `json`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::common::{check_len, list_limit, query_in_range, OBJECT_LIST};
use crate::error::ApiError;

pub const OBJECT_DATASET: &str = "dataset";
pub const OBJECT_DATASET_DELETED: &str = "dataset.deleted";
pub const OBJECT_UPLOAD: &str = "dataset.upload";
pub const OBJECT_UPLOAD_PART: &str = "dataset.upload.part";
pub const OBJECT_QUERY_TEMPLATES: &str = "dataset.query_templates";
/// Default and largest `limit` of the dataset list and of content pages
/// (the spec's).
pub const DEFAULT_DATASET_LIMIT: i64 = 100;
pub const MAX_DATASET_LIMIT: i64 = 1000;
/// Longest dataset name, folder and description.
pub const MAX_NAME: usize = 256;
pub const MAX_FOLDER: usize = 1024;
pub const MAX_DESCRIPTION: usize = 4096;
/// Most rows of the direct creation variant (larger sets use uploads).
pub const MAX_INLINE_ROWS: usize = 10_000;

/// A column's type, as `{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ColumnTypeName {
    /// `string`, `integer`, `float`, `boolean` or `json`.
    pub name: String,
}

/// One column of a dataset's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SchemaColumn {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: ColumnTypeName,
}

/// A dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetObject {
    pub id: String,
    /// `dataset`.
    pub object: String,
    pub name: String,
    pub folder: Option<String>,
    pub description: Option<String>,
    pub schema: Vec<SchemaColumn>,
    pub row_count: i64,
    /// Bytes of its stored (Parquet) parts.
    pub bytes: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub ai_project_id: String,
    /// Where the rows came from (`{type: "upload", upload_id}`,
    /// `{type: "inline"}` or `{type: "object_storage", url, format}`).
    #[schema(value_type = Object)]
    pub source: Option<Value>,
}

/// A page of datasets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetList {
    /// `list`.
    pub object: String,
    pub data: Vec<DatasetObject>,
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

impl DatasetList {
    pub fn new(data: Vec<DatasetObject>, has_more: bool) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            first_id: data.first().map(|d| d.id.clone()),
            last_id: data.last().map(|d| d.id.clone()),
            data,
            has_more,
        }
    }
}

/// `sort_by` of the dataset list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetSortBy {
    #[default]
    CreatedAt,
    Name,
}

/// `sort_order` of the dataset list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    Asc,
    #[default]
    Desc,
}

/// Query of `GET /v1/datasets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DatasetListQuery {
    /// Datasets per page (1 to 1000, else 422); default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// A dataset id: the page holds the datasets after it in this order.
    #[serde(default)]
    pub after: Option<String>,
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
    /// `created_at` (default) or `name`.
    #[serde(default)]
    #[param(inline)]
    pub sort_by: DatasetSortBy,
    /// `desc` (default) or `asc`.
    #[serde(default)]
    #[param(inline)]
    pub sort_order: SortOrder,
}

impl DatasetListQuery {
    /// The checked `limit` (422 shape C outside 1..=1000).
    pub fn limit(&self) -> Result<i64, ApiError> {
        list_limit(self.limit, DEFAULT_DATASET_LIMIT, MAX_DATASET_LIMIT)
    }

    /// `after`, an empty value read as absent.
    pub fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|a| !a.is_empty())
    }
}

/// Query of `GET /v1/datasets/{id}/content`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ContentQuery {
    /// Rows per page (1 to 1000, else 422); default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Rows to skip (at least 0, else 422); default 0.
    #[serde(default)]
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

impl ContentQuery {
    /// The checked `(limit, offset)` (422 shape C when out of range).
    pub fn checked(&self) -> Result<(i64, i64), ApiError> {
        let limit = list_limit(self.limit, DEFAULT_DATASET_LIMIT, MAX_DATASET_LIMIT)?;
        let offset = query_in_range("offset", self.offset.unwrap_or(0), 0, None)?;
        Ok((limit, offset))
    }
}

/// A page of rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetContent {
    /// `list`.
    pub object: String,
    #[schema(value_type = Vec<Object>)]
    pub data: Vec<Map<String, Value>>,
    pub offset: i64,
    pub limit: i64,
    /// Rows in the dataset.
    pub total: i64,
}

/// `format` of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExportFormat {
    Csv,
    Jsonl,
}

/// Query of `GET /v1/datasets/{id}/export`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// `csv` or `jsonl` (required).
    #[param(inline)]
    pub format: ExportFormat,
    /// Comma-separated column names, in the order wanted (default: all).
    #[serde(default)]
    pub columns: Option<String>,
    /// Most rows (default: all).
    #[serde(default)]
    #[param(minimum = 0)]
    pub limit: Option<u64>,
}

impl ExportQuery {
    /// The named columns, in order; `None` for all. Empty names are
    /// skipped; a name given twice is 400.
    pub fn columns(&self) -> Result<Option<Vec<String>>, ApiError> {
        let Some(list) = self.columns.as_deref().filter(|c| !c.trim().is_empty()) else {
            return Ok(None);
        };
        let mut names: Vec<String> = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if names.iter().any(|n| n == name) {
                return Err(ApiError::bad_request(
                    Some("columns"),
                    format!("The column `{name}` is named twice."),
                ));
            }
            names.push(name.to_string());
        }
        Ok(Some(names))
    }
}

/// `DELETE /v1/datasets/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetDeleted {
    pub id: String,
    /// `dataset.deleted`.
    pub object: String,
    pub deleted: bool,
}

/// Body of `PATCH /v1/datasets/{id}`: only these fields; `null` clears
/// `folder` or `description`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
pub struct DatasetPatchRequest {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "crate::de::double_option")]
    pub folder: Option<Option<String>>,
    #[serde(default, deserialize_with = "crate::de::double_option")]
    pub description: Option<Option<String>>,
}

/// The fields `PATCH` may change.
pub const PATCHABLE: &[&str] = &["name", "folder", "description"];

impl DatasetPatchRequest {
    /// Parses a patch body: any field but [`PATCHABLE`] is 400 naming it.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ApiError> {
        if let Some(field) = body.keys().find(|k| !PATCHABLE.contains(&k.as_str())) {
            return Err(ApiError::bad_request(
                Some(field),
                format!(
                    "`{field}` cannot be changed; a patch may set only `name`, `folder` and \
                     `description`."
                ),
            ));
        }
        if body.get("name").is_some_and(Value::is_null) {
            return Err(ApiError::bad_request(
                Some("name"),
                "A dataset's `name` cannot be removed; give a new name or leave it out.",
            ));
        }
        // A wrong type is 422 naming the field, as for every body.
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        let patch: Self = crate::parse::parse_json_body(&bytes)?;
        if let Some(name) = &patch.name {
            check_name(name)?;
        }
        if let Some(Some(folder)) = &patch.folder {
            check_len("folder", folder, MAX_FOLDER)?;
        }
        if let Some(Some(description)) = &patch.description {
            check_len("description", description, MAX_DESCRIPTION)?;
        }
        Ok(patch)
    }
}

/// A dataset's name: non-blank, at most [`MAX_NAME`] bytes (400 shape B).
pub fn check_name(name: &str) -> Result<(), ApiError> {
    crate::common::check_name(name, MAX_NAME)
}

/// A new dataset's name, folder and description (400 shape B naming the
/// field over its limit).
fn check_descriptive(
    name: &str,
    folder: Option<&str>,
    description: Option<&str>,
) -> Result<(), ApiError> {
    check_name(name)?;
    if let Some(folder) = folder {
        check_len("folder", folder, MAX_FOLDER)?;
    }
    if let Some(description) = description {
        check_len("description", description, MAX_DESCRIPTION)?;
    }
    Ok(())
}

/// Body of `POST /v1/datasets/uploads`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
pub struct UploadCreateRequest {
    pub name: String,
    #[serde(default)]
    pub folder: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub schema: Vec<SchemaColumn>,
}

impl UploadCreateRequest {
    /// Name, folder and description limits (the schema is checked by the
    /// store's rules).
    pub fn validate(&self) -> Result<(), ApiError> {
        check_descriptive(
            &self.name,
            self.folder.as_deref(),
            self.description.as_deref(),
        )
    }
}

/// Where an import reads from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetSource {
    /// `object_storage`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `s3://bucket/key` or `file:///path`.
    pub url: String,
    /// `jsonl`, `csv` or `parquet` (default: from the URL's extension).
    #[serde(default)]
    pub format: Option<String>,
}

/// Body of `POST /v1/datasets`: rows inline (`rows`) or an import
/// (`source`), exactly one of them.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
pub struct DatasetCreateRequest {
    pub name: String,
    #[serde(default)]
    pub folder: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Inferred from the rows when absent.
    #[serde(default)]
    pub schema: Option<Vec<SchemaColumn>>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub rows: Option<Vec<Value>>,
    #[serde(default)]
    pub source: Option<DatasetSource>,
}

impl DatasetCreateRequest {
    pub fn validate(&self) -> Result<(), ApiError> {
        check_descriptive(
            &self.name,
            self.folder.as_deref(),
            self.description.as_deref(),
        )?;
        match (&self.rows, &self.source) {
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                Some("rows"),
                "Give either `rows` or `source`, not both.",
            )),
            (None, None) => Err(ApiError::bad_request(
                Some("rows"),
                "Give the rows inline (`rows`) or where to import them from (`source`).",
            )),
            (Some(rows), None) if rows.len() > MAX_INLINE_ROWS => Err(ApiError::bad_request(
                Some("rows"),
                format!(
                    "At most {MAX_INLINE_ROWS} rows inline; upload larger sets in parts \
                     (`/v1/datasets/uploads`)."
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The dataset an upload makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UploadDataset {
    pub name: String,
    pub schema: Vec<SchemaColumn>,
    pub folder: Option<String>,
    /// Set once the upload is `COMPLETED`.
    pub id: Option<String>,
}

/// The state of an upload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UploadInfo {
    /// `PENDING`, `COMPLETED`, `CANCELLED` or `FAILED`.
    pub status: String,
    pub dataset: UploadDataset,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    pub error: Option<String>,
    pub ai_project_id: String,
}

/// A multipart upload (the spec's Upload record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UploadObject {
    pub id: String,
    /// `dataset.upload`.
    pub object: String,
    pub upload_info: UploadInfo,
}

/// A received part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UploadPartObject {
    pub id: String,
    /// `dataset.upload.part`.
    pub object: String,
    pub upload_id: String,
    pub rows: i64,
    /// Bytes of the part as stored (Parquet).
    pub bytes: i64,
    pub created_at: i64,
}

/// Body of `POST /v1/datasets/uploads/{id}/complete`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
pub struct UploadCompleteRequest {
    pub part_ids: Vec<String>,
}

/// One ready-made query over a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueryTemplate {
    pub name: String,
    pub description: String,
    pub query: String,
}

/// `GET /v1/datasets/{id}/query_templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueryTemplates {
    /// `dataset.query_templates`.
    pub object: String,
    pub dataset_id: String,
    pub templates: Vec<QueryTemplate>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorBody, Loc};
    use serde_json::json;

    #[test]
    fn patches_take_only_descriptive_fields() {
        let body = json!({"name": "n", "folder": null, "description": "d"});
        let patch = DatasetPatchRequest::parse(body.as_object().unwrap()).unwrap();
        assert_eq!(patch.name.as_deref(), Some("n"));
        assert_eq!(patch.folder, Some(None));
        assert_eq!(patch.description, Some(Some("d".into())));
        let empty = DatasetPatchRequest::parse(&Map::new()).unwrap();
        assert_eq!(empty, DatasetPatchRequest::default());
        let err = DatasetPatchRequest::parse(json!({"schema": []}).as_object().unwrap());
        assert_eq!(err.unwrap_err().param(), Some("schema"));
        let err = DatasetPatchRequest::parse(json!({"name": " "}).as_object().unwrap());
        assert_eq!(err.unwrap_err().param(), Some("name"));
        let err = DatasetPatchRequest::parse(json!({"name": null}).as_object().unwrap());
        assert_eq!(err.unwrap_err().param(), Some("name"));
        for (field, value) in [
            ("name", json!(1)),
            ("folder", json!([])),
            ("description", json!(true)),
        ] {
            let mut body = Map::new();
            body.insert(field.to_string(), value);
            let err = DatasetPatchRequest::parse(&body).unwrap_err();
            assert_eq!(err.status(), 422, "{field}");
            let ErrorBody::Validation(items) = err.body() else {
                panic!("{field}: not shape C");
            };
            assert_eq!(
                items[0].loc,
                [Loc::from("body"), Loc::from(field)],
                "{field}"
            );
        }
    }

    #[test]
    fn content_and_list_queries_are_checked() {
        let q = ContentQuery {
            limit: None,
            offset: None,
        };
        assert_eq!(q.checked().unwrap(), (100, 0));
        let q = ContentQuery {
            limit: Some(1001),
            offset: None,
        };
        assert_eq!(q.checked().unwrap_err().status(), 422);
        let q = ContentQuery {
            limit: Some(5),
            offset: Some(-1),
        };
        assert_eq!(q.checked().unwrap_err().status(), 422);
        let q: DatasetListQuery = crate::parse_query(Some("sort_by=name&sort_order=asc")).unwrap();
        assert_eq!(
            (q.sort_by, q.sort_order),
            (DatasetSortBy::Name, SortOrder::Asc)
        );
        let bad = crate::parse_query::<DatasetListQuery>(Some("sort_by=size"));
        assert_eq!(bad.unwrap_err().status(), 422);
        let missing = crate::parse_query::<ExportQuery>(Some("columns=a"));
        assert_eq!(missing.unwrap_err().status(), 422);
    }

    #[test]
    fn export_columns_are_split_in_order() {
        let q: ExportQuery = crate::parse_query(Some("format=csv&columns=b,%20a,,c")).unwrap();
        assert_eq!(
            q.columns().unwrap(),
            Some(vec!["b".into(), "a".into(), "c".into()])
        );
        let q: ExportQuery = crate::parse_query(Some("format=jsonl&columns=a,a")).unwrap();
        assert_eq!(q.columns().unwrap_err().param(), Some("columns"));
        let q: ExportQuery = crate::parse_query(Some("format=jsonl")).unwrap();
        assert_eq!(q.columns().unwrap(), None);
    }

    #[test]
    fn creation_needs_rows_or_a_source() {
        let parse = |v: Value| serde_json::from_value::<DatasetCreateRequest>(v).unwrap();
        assert!(parse(json!({"name": "a", "rows": [{"x": 1}]}))
            .validate()
            .is_ok());
        assert!(parse(json!({"name": "a"})).validate().is_err());
        let both = json!({"name": "a", "rows": [], "source": {"type": "object_storage", "url": "file:///x"}});
        assert!(parse(both).validate().is_err());
    }
}
