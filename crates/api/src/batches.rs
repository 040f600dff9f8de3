//! `/v1/batches` wire types: creation (checked), the batch object, its list
//! and list query, the lines of an input file and of the result files.
//!
//! A batch runs every line of a JSONL input file (purpose `batch`) against
//! one endpoint, as OpenAI's Batch API does: each line is
//! `{custom_id, method: "POST", url, body}`; each result line is
//! `{id, custom_id, response: {status_code, request_id, body}, error}`.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::common::{list_limit, OBJECT_LIST};
use crate::error::ApiError;

/// `object` of a batch.
pub const OBJECT_BATCH: &str = "batch";
/// Purpose of a batch's input file.
pub const PURPOSE_BATCH: &str = "batch";
/// Purpose of the result files a batch writes.
pub const PURPOSE_BATCH_OUTPUT: &str = "batch_output";
/// The endpoints a batch may run.
pub const BATCH_ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];
/// The completion windows a batch may ask for (OpenAI's one).
pub const COMPLETION_WINDOWS: &[&str] = &["24h"];
/// Default `limit` of the batch list (the spec's).
pub const DEFAULT_BATCH_LIST_LIMIT: i64 = 10;
/// Largest `limit` of the batch list (OpenAI's).
pub const MAX_BATCH_LIST_LIMIT: i64 = 100;
/// Most metadata pairs, and the longest key and value (OpenAI's).
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;
/// Longest `custom_id` of an input line.
pub const MAX_CUSTOM_ID: usize = 512;

/// Seconds a completion window (`24h`) lasts.
pub fn window_secs(window: &str) -> Option<i64> {
    let hours: i64 = window.strip_suffix('h')?.parse().ok()?;
    (hours > 0).then_some(hours * 3600)
}

/// Settings applied to every request of a batch (the spec's
/// `override_settings`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OverrideSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

impl OverrideSettings {
    fn check(&self) -> Result<(), ApiError> {
        let bad = |name: &str, message: &str| {
            Err(ApiError::bad_request(
                Some(&format!("override_settings.{name}")),
                message.to_string(),
            ))
        };
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return bad("model", "`model` must not be empty.");
        }
        if self
            .temperature
            .is_some_and(|t| !(0.0..=2.0).contains(&t) || t.is_nan())
        {
            return bad("temperature", "`temperature` must be between 0 and 2.");
        }
        if self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return bad("top_p", "`top_p` must be greater than 0 and at most 1.");
        }
        if self.max_tokens == Some(0) {
            return bad("max_tokens", "`max_tokens` must be at least 1.");
        }
        Ok(())
    }

    /// Sets the overrides in one request body of `endpoint`: `model`
    /// everywhere; `temperature`, `top_p` and the token limit (`max_tokens`
    /// of completions and chat, where it replaces `max_completion_tokens`;
    /// `max_output_tokens` of responses) where the endpoint has them.
    pub fn apply(&self, endpoint: &str, body: &mut Map<String, Value>) {
        if let Some(model) = &self.model {
            body.insert("model".into(), Value::String(model.clone()));
        }
        if endpoint == "/v1/embeddings" {
            return;
        }
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), t.into());
        }
        if let Some(p) = self.top_p {
            body.insert("top_p".into(), p.into());
        }
        if let Some(n) = self.max_tokens {
            let field = match endpoint {
                "/v1/responses" => "max_output_tokens",
                "/v1/chat/completions" => {
                    body.remove("max_completion_tokens");
                    "max_tokens"
                }
                _ => "max_tokens",
            };
            body.insert(field.into(), n.into());
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `POST /v1/batches`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchCreateRequest {
    /// A file of the project with purpose `batch`.
    pub input_file_id: String,
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` or
    /// `/v1/responses`.
    pub endpoint: String,
    /// `24h`.
    pub completion_window: String,
    /// Up to 16 pairs of strings (keys up to 64 characters, values up to
    /// 512).
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Applied to every request of the batch.
    #[serde(default)]
    pub override_settings: Option<OverrideSettings>,
}

impl BatchCreateRequest {
    /// Checks what the request itself shows (400 shape B naming the
    /// field); the file is the server's to check.
    pub fn validate(&self) -> Result<(), ApiError> {
        if !BATCH_ENDPOINTS.contains(&self.endpoint.as_str()) {
            return Err(ApiError::bad_request(
                Some("endpoint"),
                format!(
                    "`{}` is not an endpoint batches can run; use one of {}.",
                    self.endpoint,
                    BATCH_ENDPOINTS.join(", ")
                ),
            ));
        }
        if !COMPLETION_WINDOWS.contains(&self.completion_window.as_str()) {
            return Err(ApiError::bad_request(
                Some("completion_window"),
                format!(
                    "`{}` is not a supported completion window; use `24h`.",
                    self.completion_window
                ),
            ));
        }
        if self.input_file_id.trim().is_empty() {
            return Err(ApiError::bad_request(
                Some("input_file_id"),
                "`input_file_id` must not be empty.",
            ));
        }
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata)?;
        }
        if let Some(settings) = &self.override_settings {
            settings.check()?;
        }
        Ok(())
    }
}

/// OpenAI's limits on `metadata` (batches, fine-tuning jobs): at most 16
/// pairs, keys up to 64 characters, values up to 512; else a 400 naming
/// `metadata`.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |message: String| Err(ApiError::bad_request(Some("metadata"), message));
    if metadata.len() > MAX_METADATA_PAIRS {
        return bad(format!(
            "`metadata` holds {} pairs; at most {MAX_METADATA_PAIRS} are allowed.",
            metadata.len()
        ));
    }
    for (key, value) in metadata {
        if key.chars().count() > MAX_METADATA_KEY {
            return bad(format!(
                "the `metadata` key `{key}` is longer than {MAX_METADATA_KEY} characters."
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE {
            return bad(format!(
                "the `metadata` value of `{key}` is longer than {MAX_METADATA_VALUE} characters."
            ));
        }
    }
    Ok(())
}

/// `request_counts` of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchRequestCounts {
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

/// One problem found in a batch's input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    /// The input file's line (from 1), when the problem is on one.
    pub line: Option<u64>,
}

/// `errors` of a batch that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchErrors {
    /// `list`.
    pub object: String,
    pub data: Vec<BatchError>,
}

impl BatchErrors {
    pub fn new(data: Vec<BatchError>) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            data,
        }
    }
}

/// A batch, as OpenAI returns it, with the spec's `override_settings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchObject {
    pub id: String,
    /// `batch`.
    pub object: String,
    pub endpoint: String,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    /// `validating`, `failed`, `in_progress`, `finalizing`, `completed`,
    /// `expired`, `cancelling` or `cancelled`.
    pub status: String,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: BatchRequestCounts,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    pub override_settings: Option<OverrideSettings>,
}

/// A page of batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchList {
    /// `list`.
    pub object: String,
    pub data: Vec<BatchObject>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

impl BatchList {
    pub fn new(data: Vec<BatchObject>, has_more: bool) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            first_id: data.first().map(|b| b.id.clone()),
            last_id: data.last().map(|b| b.id.clone()),
            data,
            has_more,
        }
    }
}

/// Query of `GET /v1/batches`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BatchListQuery {
    /// Batches per page (1 to 100, else 422); default 10.
    #[serde(default)]
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// A batch id: the page holds the batches created before it.
    #[serde(default)]
    pub after: Option<String>,
    /// Only the batches of this input file.
    #[serde(default)]
    pub input_file_id: Option<String>,
    /// The project (see [`crate::ProjectQuery`]).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

impl BatchListQuery {
    /// The checked `limit` (422 shape C outside 1..=100).
    pub fn limit(&self) -> Result<i64, ApiError> {
        list_limit(self.limit, DEFAULT_BATCH_LIST_LIMIT, MAX_BATCH_LIST_LIMIT)
    }

    /// `after`, an empty value read as absent.
    pub fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|a| !a.is_empty())
    }

    /// `input_file_id`, an empty value read as absent.
    pub fn input_file_id(&self) -> Option<&str> {
        self.input_file_id.as_deref().filter(|a| !a.is_empty())
    }
}

/// One request of an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInputLine {
    pub custom_id: String,
    /// The request body, with the batch's overrides applied.
    pub body: Map<String, Value>,
}

/// Reads one line of an input file for a batch of `endpoint`: a JSON
/// object `{custom_id, method: "POST", url: <endpoint>, body: {...}}`,
/// without `stream`. The message says what is wrong (the caller adds the
/// line number).
pub fn parse_input_line(
    text: &str,
    endpoint: &str,
    overrides: Option<&OverrideSettings>,
) -> Result<BatchInputLine, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(mut line) = value else {
        return Err("not a JSON object".into());
    };
    let custom_id = match line.remove("custom_id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(Value::String(_)) => return Err("`custom_id` is empty".into()),
        Some(_) => return Err("`custom_id` must be a string".into()),
        None => return Err("`custom_id` is missing".into()),
    };
    if custom_id.chars().count() > MAX_CUSTOM_ID {
        return Err(format!(
            "`custom_id` is longer than {MAX_CUSTOM_ID} characters"
        ));
    }
    match line.get("method") {
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(m) => return Err(format!("`method` must be `POST`, not {m}")),
        None => return Err("`method` is missing (it must be `POST`)".into()),
    }
    match line.get("url") {
        Some(Value::String(url)) if url == endpoint => {}
        Some(Value::String(url)) => {
            return Err(format!(
                "`url` `{url}` is not the batch's endpoint `{endpoint}`"
            ))
        }
        Some(_) => return Err("`url` must be a string".into()),
        None => return Err("`url` is missing".into()),
    }
    let mut body = match line.remove("body") {
        Some(Value::Object(body)) => body,
        Some(_) => return Err("`body` must be a JSON object".into()),
        None => return Err("`body` is missing".into()),
    };
    if body
        .get("stream")
        .is_some_and(|s| s.as_bool() == Some(true))
    {
        return Err("`body.stream` is true; batch requests cannot stream".into());
    }
    if let Some(overrides) = overrides {
        overrides.apply(endpoint, &mut body);
    }
    Ok(BatchInputLine { custom_id, body })
}

/// Checks that each `custom_id` appears once; the first repeat's message.
#[derive(Debug, Default)]
pub struct CustomIds(HashSet<String>);

impl CustomIds {
    pub fn insert(&mut self, id: &str) -> Result<(), String> {
        if self.0.insert(id.to_string()) {
            Ok(())
        } else {
            Err(format!(
                "`custom_id` `{id}` appears on an earlier line; each must be unique"
            ))
        }
    }
}

/// `response` of a result line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchResponse {
    pub status_code: u16,
    pub request_id: String,
    #[schema(value_type = Object)]
    pub body: Value,
}

/// `error` of a result line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchLineError {
    pub code: String,
    pub message: String,
}

/// A line of a batch's output or error file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchOutputLine {
    /// `batch_req_...`.
    pub id: String,
    pub custom_id: String,
    pub response: Option<BatchResponse>,
    pub error: Option<BatchLineError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(endpoint: &str, window: &str) -> BatchCreateRequest {
        BatchCreateRequest {
            input_file_id: "file-x".into(),
            endpoint: endpoint.into(),
            completion_window: window.into(),
            metadata: None,
            override_settings: None,
        }
    }

    #[test]
    fn creation_checks_name_the_field() {
        assert!(request("/v1/chat/completions", "24h").validate().is_ok());
        let e = request("/v1/images/generations", "24h")
            .validate()
            .unwrap_err();
        assert_eq!((e.status(), e.param()), (400, Some("endpoint")));
        let e = request("/v1/embeddings", "1h").validate().unwrap_err();
        assert_eq!(e.param(), Some("completion_window"));
        let mut r = request("/v1/embeddings", "24h");
        r.metadata = Some((0..17).map(|i| (i.to_string(), "v".into())).collect());
        assert_eq!(r.validate().unwrap_err().param(), Some("metadata"));
        r.metadata = None;
        r.override_settings = Some(OverrideSettings {
            temperature: Some(3.0),
            ..Default::default()
        });
        assert_eq!(
            r.validate().unwrap_err().param(),
            Some("override_settings.temperature")
        );
        assert_eq!(window_secs("24h"), Some(86_400));
        assert_eq!(window_secs("x"), None);
    }

    #[test]
    fn input_lines_are_checked_and_overridden() {
        let ep = "/v1/chat/completions";
        let good = r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","max_completion_tokens":9}}"#;
        let overrides = OverrideSettings {
            model: Some("other".into()),
            max_tokens: Some(5),
            ..Default::default()
        };
        let line = parse_input_line(good, ep, Some(&overrides)).unwrap();
        assert_eq!(line.custom_id, "a");
        assert_eq!(line.body["model"], "other");
        assert_eq!(line.body["max_tokens"], 5);
        assert!(!line.body.contains_key("max_completion_tokens"));
        for (text, want) in [
            ("{", "not valid JSON"),
            ("[1]", "not a JSON object"),
            (
                r#"{"method":"POST","url":"/v1/chat/completions","body":{}}"#,
                "`custom_id` is missing",
            ),
            (
                r#"{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{}}"#,
                "`method`",
            ),
            (
                r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{}}"#,
                "not the batch's endpoint",
            ),
            (
                r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":3}"#,
                "`body` must be",
            ),
            (
                r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"stream":true}}"#,
                "cannot stream",
            ),
        ] {
            let e = parse_input_line(text, ep, None).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let mut ids = CustomIds::default();
        assert!(ids.insert("a").is_ok());
        assert!(ids.insert("a").unwrap_err().contains("unique"));
    }

    #[test]
    fn list_pages_name_their_ends() {
        let list = BatchList::new(vec![], false);
        assert_eq!((list.first_id, list.last_id), (None, None));
        let q = BatchListQuery {
            limit: Some(101),
            ..Default::default()
        };
        assert_eq!(q.limit().unwrap_err().status(), 422);
        assert_eq!(BatchListQuery::default().limit().unwrap(), 10);
    }
}
