//! Schemas of wire shapes that have no struct of their own: the error
//! bodies (built as JSON by [`crate::ApiError`]), the stream error event,
//! `finish_reason`, `/health`, the upload form, and value sets taken from
//! the API's constants. They exist for the OpenAPI document only.

use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::ToSchema;

use crate::error::ValidationItem;

/// Why a choice stopped: an end-of-sequence token or a stop string
/// (`stop`), `max_tokens` or the context length (`length`), or an answer
/// of tool calls (`tool_calls`, chat only; `function_call` for the
/// deprecated `functions`).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    FunctionCall,
}

/// Shape A: `{"detail": "<message>"}` (authentication, project, access,
/// not found, conflicts, size limits, unexpected errors).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    pub detail: String,
}

/// Shape B: an invalid request (400), a model failure (500), no capacity
/// (503) or an overloaded server (529).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UpstreamError {
    pub error: UpstreamErrorObject,
    /// For 400: the fixed invalid-request sentence and `error.message`;
    /// otherwise `error.message`.
    pub detail: String,
}

/// `error` of shape B.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UpstreamErrorObject {
    pub message: String,
    /// `BadRequestError` or `InternalServerError`.
    #[schema(rename = "type")]
    pub kind: String,
    /// The HTTP status, as an integer.
    pub code: u16,
    /// The offending parameter, when one is to blame.
    pub param: Option<String>,
}

/// Shape C (422): the request did not parse (pydantic's error items).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ValidationError {
    pub detail: Vec<ValidationItem>,
}

/// The event sent when a completion or chat stream fails after it started
/// (then `data: [DONE]`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StreamErrorEvent {
    pub error: StreamErrorObject,
}

/// `error` of a stream error event.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StreamErrorObject {
    #[schema(rename = "type")]
    pub kind: String,
    /// The status, as a string.
    pub code: String,
    pub message: String,
    pub param: Option<String>,
}

/// `GET /health`, `/health/ready` and `/health/live`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Health {
    /// `ok` (200), else why not (503): `engine stopped`, `shutting down`.
    pub status: String,
    /// The chat models whose engine has stopped, when any.
    #[schema(required = false)]
    pub dead_engines: Vec<String>,
}

/// The form of `POST /v1/files` (`multipart/form-data`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct FileUploadForm {
    /// The file's bytes; its form filename becomes `filename`.
    #[schema(value_type = String, format = Binary, content_media_type = "application/octet-stream")]
    pub file: Vec<u8>,
    #[schema(schema_with = upload_purpose)]
    pub purpose: String,
}

fn string_enum(values: &[&str]) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
}

/// `purpose` of an upload: one of [`crate::files::UPLOAD_PURPOSES`].
pub fn upload_purpose() -> ObjectBuilder {
    string_enum(crate::files::UPLOAD_PURPOSES)
}

/// `purpose` of a file list filter: one of [`crate::files::LIST_PURPOSES`].
pub fn list_purpose() -> ObjectBuilder {
    string_enum(crate::files::LIST_PURPOSES)
}

/// `role` of a chat request message.
pub fn chat_role() -> ObjectBuilder {
    string_enum(&["system", "developer", "user", "assistant"])
}

/// An integer, `"auto"` (the default) or null: `AutoOr<i64>` of the
/// fine-tuning hyperparameters.
pub fn auto_integer() -> Schema {
    auto_or(Type::Integer)
}

/// A number, `"auto"` (the default) or null: `AutoOr<f64>`.
pub fn auto_number() -> Schema {
    auto_or(Type::Number)
}

fn auto_or(kind: Type) -> Schema {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(kind))
        .item(string_enum(&["auto"]))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .build()
        .into()
}
