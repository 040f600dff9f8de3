//! Error bodies of the HTTP API and the SSE error event.
//!
//! One type, [`ApiError`], carries an HTTP status and one of the spec's three
//! body shapes:
//!
//! - A: `{"detail": "<string>"}` (auth, project, not found, internal, ...);
//! - B: `{"error": {"message", "type", "code": <int>, "param"}, "detail"}`
//!   (invalid request, model failure, overload, no capacity);
//! - C: `{"detail": [{"type", "loc", "msg", "input", "ctx"?}]}` (422, FastAPI
//!   style, built by [`crate::parse`]).
//!
//! [`ApiError::stream_event`] gives the same error as the event sent inside a
//! completion or chat stream. `EngineError -> ApiError` is mapped here, once.

use std::fmt;

use hearth_core::EngineError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

/// The fixed sentence that begins `detail` of every 400 shape-B body.
pub const INVALID_REQUEST_PREFIX: &str =
    "Invalid request. Please check the parameters and try again. Details: ";

/// One element of a validation error's `loc`: a key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Loc {
    Index(usize),
    Key(String),
}

impl From<&str> for Loc {
    fn from(key: &str) -> Self {
        Loc::Key(key.to_string())
    }
}

impl From<usize> for Loc {
    fn from(index: usize) -> Self {
        Loc::Index(index)
    }
}

/// One item of a 422 body (pydantic's error item).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ValidationItem {
    /// pydantic's error type, e.g. `missing`, `string_type`, `json_invalid`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `"body"` or `"query"` first, then keys and indices.
    pub loc: Vec<Loc>,
    pub msg: String,
    /// The offending input (the enclosing object for `missing`).
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub ctx: Option<Value>,
}

/// The body of an [`ApiError`].
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorBody {
    /// Shape A.
    Detail(String),
    /// Shape B.
    Upstream {
        message: String,
        /// `error.type`, e.g. `BadRequestError`.
        kind: String,
        /// `error.code` (an integer in the body, a string in stream events).
        code: u16,
        param: Option<String>,
        detail: String,
    },
    /// Shape C.
    Validation(Vec<ValidationItem>),
}

/// An HTTP error: a status and a body in one of the spec's shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    status: u16,
    body: ErrorBody,
    /// Seconds to wait before retrying (sent as `Retry-After`); 0: none.
    /// A `u32` beside `status` keeps the error as small as it was.
    retry_after: u32,
}

impl ApiError {
    /// Shape A with any status.
    pub fn with_detail(status: u16, detail: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody::Detail(detail.into()),
            retry_after: 0,
        }
    }

    /// Shape B with any status, type and code; `detail` repeats the message.
    pub fn upstream(
        status: u16,
        kind: &str,
        code: u16,
        param: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        let message = message.into();
        Self {
            status,
            body: ErrorBody::Upstream {
                detail: message.clone(),
                message,
                kind: kind.to_string(),
                code,
                param: param.map(str::to_string),
            },
            retry_after: 0,
        }
    }

    /// 401, shape A; `detail` says whether the key is missing or invalid.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::with_detail(401, detail)
    }

    /// 400, shape A: the project id is missing or invalid.
    pub fn project(detail: impl Into<String>) -> Self {
        Self::with_detail(400, detail)
    }

    /// 402, shape A: the budget is exhausted.
    pub fn payment_required(detail: impl Into<String>) -> Self {
        Self::with_detail(402, detail)
    }

    /// 403, shape A: no access to the resource, or it does not exist.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::with_detail(403, detail)
    }

    /// 404, shape A: the model does not exist.
    pub fn model_not_found(model: &str) -> Self {
        Self::with_detail(404, format!("The model `{model}` does not exist."))
    }

    /// 404, shape A, any detail.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::with_detail(404, detail)
    }

    /// 413, shape A: the request body is over the server's limit.
    pub fn payload_too_large(limit_bytes: usize) -> Self {
        Self::with_detail(
            413,
            format!("The request body is larger than the limit of {limit_bytes} bytes."),
        )
    }

    /// 429, shape A: the token quota of a model is used up; `Retry-After`
    /// carries the same number of seconds as the detail.
    pub fn rate_limited(model: &str, retry_after_secs: u64) -> Self {
        Self::quota_exceeded("Token", model, retry_after_secs)
    }

    /// 429, shape A: the requests-per-minute quota of a model is used up
    /// (the token quota's answer, naming the quota that refused).
    pub fn request_rate_limited(model: &str, retry_after_secs: u64) -> Self {
        Self::quota_exceeded("Request", model, retry_after_secs)
    }

    fn quota_exceeded(what: &str, model: &str, retry_after_secs: u64) -> Self {
        let mut e = Self::with_detail(
            429,
            format!(
                "{what} quota exceeded for model `{model}`. Retry after {retry_after_secs} seconds."
            ),
        );
        e.retry_after = u32::try_from(retry_after_secs.max(1)).unwrap_or(u32::MAX);
        e
    }

    /// Seconds to wait before retrying, for a `Retry-After` header.
    pub fn retry_after(&self) -> Option<u64> {
        (self.retry_after > 0).then_some(u64::from(self.retry_after))
    }

    /// 500, shape A: an unexpected error.
    pub fn internal() -> Self {
        Self::with_detail(500, "Internal server error, please try again later.")
    }

    /// 503, shape A: a connection to an upstream failed.
    pub fn upstream_unavailable(detail: impl Into<String>) -> Self {
        Self::with_detail(503, detail)
    }

    /// 400, shape B, type `BadRequestError`, code 400; `detail` is the fixed
    /// invalid-request sentence followed by `message`.
    pub fn bad_request(param: Option<&str>, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            status: 400,
            body: ErrorBody::Upstream {
                detail: format!("{INVALID_REQUEST_PREFIX}{message}"),
                message,
                kind: "BadRequestError".to_string(),
                code: 400,
                param: param.map(str::to_string),
            },
            retry_after: 0,
        }
    }

    /// 529, shape B: the system is overloaded.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::upstream(529, "InternalServerError", 529, None, message)
    }

    /// 500, shape B: the model failed to process the request.
    pub fn model_failed(message: impl Into<String>) -> Self {
        Self::upstream(500, "InternalServerError", 500, None, message)
    }

    /// 503, shape B: no engine is available to serve the request.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::upstream(503, "InternalServerError", 503, None, message)
    }

    /// 422, shape C.
    pub fn validation(items: Vec<ValidationItem>) -> Self {
        Self {
            status: 422,
            body: ErrorBody::Validation(items),
            retry_after: 0,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The body, typed.
    pub fn body(&self) -> &ErrorBody {
        &self.body
    }

    /// `param` of a shape-B body.
    pub fn param(&self) -> Option<&str> {
        match &self.body {
            ErrorBody::Upstream { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// A one-line human message (shape B's `message`, shape A's `detail`,
    /// shape C's items joined).
    pub fn message(&self) -> String {
        match &self.body {
            ErrorBody::Detail(detail) => detail.clone(),
            ErrorBody::Upstream { message, .. } => message.clone(),
            ErrorBody::Validation(items) => items
                .iter()
                .map(|item| format!("{}: {}", loc_string(&item.loc), item.msg))
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// The JSON body of the HTTP response.
    pub fn body_json(&self) -> Value {
        match &self.body {
            ErrorBody::Detail(detail) => json!({ "detail": detail }),
            ErrorBody::Upstream {
                message,
                kind,
                code,
                param,
                detail,
            } => json!({
                "error": { "message": message, "type": kind, "code": code, "param": param },
                "detail": detail,
            }),
            ErrorBody::Validation(items) => json!({ "detail": items }),
        }
    }

    /// The SSE error event of a completion or chat stream:
    /// `{"error": {"type", "code": "<string>", "message", "param"}}`.
    pub fn stream_event(&self) -> Value {
        let (kind, code, param) = match &self.body {
            ErrorBody::Upstream {
                kind, code, param, ..
            } => (kind.clone(), *code, param.clone()),
            _ => (type_for_status(self.status).to_string(), self.status, None),
        };
        json!({
            "error": {
                "type": kind,
                "code": code.to_string(),
                "message": self.message(),
                "param": param,
            }
        })
    }
}

/// OpenAI's error type name for an HTTP status.
fn type_for_status(status: u16) -> &'static str {
    match status {
        400 | 413 => "BadRequestError",
        401 => "AuthenticationError",
        402 => "PaymentRequiredError",
        403 => "PermissionDeniedError",
        404 => "NotFoundError",
        422 => "UnprocessableEntityError",
        429 => "RateLimitError",
        _ => "InternalServerError",
    }
}

/// `body.messages[0].content` style rendering of a `loc`.
fn loc_string(loc: &[Loc]) -> String {
    let mut out = String::new();
    for part in loc {
        match part {
            Loc::Key(key) if out.is_empty() => out.push_str(key),
            Loc::Key(key) => {
                out.push('.');
                out.push_str(key);
            }
            Loc::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message())
    }
}

impl std::error::Error for ApiError {}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match &err {
            EngineError::Overloaded(_) => ApiError::overloaded(err.to_string()),
            EngineError::PromptTooLong { .. } => ApiError::bad_request(None, err.to_string()),
            EngineError::InvalidParameter { param, .. } => {
                ApiError::bad_request(Some(param), err.to_string())
            }
            EngineError::Model(_) => ApiError::model_failed(err.to_string()),
            EngineError::Stopped => ApiError::unavailable(err.to_string()),
        }
    }
}
