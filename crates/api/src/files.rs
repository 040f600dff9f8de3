//! `/v1/files` wire types: the file object, lists, deletion and link
//! results, the list query, and the purposes.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Loc, ValidationItem};

/// `object` of a file.
pub const OBJECT_FILE: &str = "file";
/// `object` of a download link.
pub const OBJECT_FILE_LINK: &str = "file.link";

/// Purposes a client may upload a file for.
pub const UPLOAD_PURPOSES: &[&str] = &[
    "assistants",
    "batch",
    "fine-tune",
    "vision",
    "user_data",
    "evals",
];

/// Purposes a list may filter on: the uploadable ones and those of files
/// the server writes (job results).
pub const LIST_PURPOSES: &[&str] = &[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
    "evals",
    "image",
];

/// Whether uploads of `purpose` must be JSONL (checked line by line).
pub fn purpose_is_jsonl(purpose: &str) -> bool {
    matches!(purpose, "fine-tune" | "batch")
}

/// 422 shape C for a purpose outside `allowed` (pydantic's `enum` item).
pub fn bad_purpose(location: &str, value: &str, allowed: &[&str]) -> ApiError {
    let expected = allowed
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    ApiError::validation(vec![ValidationItem {
        kind: "enum".into(),
        loc: vec![Loc::from(location), Loc::from("purpose")],
        msg: format!("Input should be {expected}"),
        input: value.into(),
        ctx: Some(serde_json::json!({ "expected": expected })),
    }])
}

/// 422 shape C for a missing multipart field.
pub fn missing_field(field: &str) -> ApiError {
    ApiError::validation(vec![ValidationItem {
        kind: "missing".into(),
        loc: vec![Loc::from("body"), Loc::from(field)],
        msg: "Field required".into(),
        input: serde_json::Value::Null,
        ctx: None,
    }])
}

/// A file, as OpenAI returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: i64,
    pub filename: String,
    pub purpose: String,
    /// `processed`, or `error` when a JSONL line is bad.
    pub status: String,
    /// Why the status is `error` (the bad line's number), else null.
    pub status_details: Option<String>,
}

/// `GET /v1/files`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub object: String,
    pub data: Vec<FileObject>,
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

impl FileList {
    pub fn new(data: Vec<FileObject>, has_more: bool) -> Self {
        Self {
            object: crate::common::OBJECT_LIST.to_string(),
            first_id: data.first().map(|f| f.id.clone()),
            last_id: data.last().map(|f| f.id.clone()),
            data,
            has_more,
        }
    }
}

/// `DELETE /v1/files/{file_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileDeleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// `GET /v1/files/{file_id}/link`: a URL that downloads the content
/// without a key until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileLink {
    pub object: String,
    pub id: String,
    pub url: String,
    pub expires_at: i64,
}

/// Order of a list by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    Asc,
    #[default]
    Desc,
}

/// Default and largest `limit` of a file list.
pub const FILES_DEFAULT_LIMIT: u32 = 10;
pub const FILES_MAX_LIMIT: u32 = 10_000;

/// Query of `GET /v1/files`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FilesQuery {
    /// Files per page, default 10 (outside 1 to 10000: 400).
    #[serde(default)]
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<i64>,
    /// Only files of this purpose (one of [`LIST_PURPOSES`]; another: 422).
    #[serde(default)]
    #[param(schema_with = crate::schemas::list_purpose)]
    pub purpose: Option<String>,
    /// A file id: the page starts after it.
    #[serde(default)]
    pub after: Option<String>,
    /// By creation time; default `desc`.
    #[serde(default)]
    #[param(value_type = Option<Order>, inline)]
    pub order: Order,
    /// The project (see [`crate::ProjectQuery`]).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

impl FilesQuery {
    /// The checked `limit`: 422 shape C outside 1..=10000, as every other
    /// list's.
    pub fn limit(&self) -> Result<u32, ApiError> {
        let n = crate::common::list_limit(
            self.limit,
            FILES_DEFAULT_LIMIT.into(),
            FILES_MAX_LIMIT.into(),
        )?;
        Ok(n as u32)
    }

    /// The checked purpose filter: 422 for an unknown purpose.
    pub fn purpose(&self) -> Result<Option<&str>, ApiError> {
        match self.purpose.as_deref() {
            None | Some("") => Ok(None),
            Some(p) if LIST_PURPOSES.contains(&p) => Ok(Some(p)),
            Some(p) => Err(bad_purpose("query", p, LIST_PURPOSES)),
        }
    }
}

/// Query of `GET /v1/files/{file_id}/link`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LinkQuery {
    /// Seconds the link stays valid (default 3600, at most 7 days; outside: 400).
    #[serde(default)]
    #[param(minimum = 1, maximum = 604800)]
    pub expires_in: Option<i64>,
}

/// Default and longest validity of a download link, in seconds.
pub const LINK_DEFAULT_SECS: i64 = 3600;
pub const LINK_MAX_SECS: i64 = 7 * 24 * 3600;

impl LinkQuery {
    pub fn expires_in(&self) -> Result<i64, ApiError> {
        match self.expires_in {
            None => Ok(LINK_DEFAULT_SECS),
            Some(n) if (1..=LINK_MAX_SECS).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::bad_request(
                Some("expires_in"),
                format!("`expires_in` must be between 1 and {LINK_MAX_SECS} seconds, got {n}."),
            )),
        }
    }
}
