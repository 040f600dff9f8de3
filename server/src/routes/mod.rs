//! HTTP routes, one module per endpoint family.

pub mod adapters;
pub mod admin;
pub mod batches;
pub mod chat;
mod chat_tools;
pub mod completions;
pub mod dataset_import;
pub mod dataset_uploads;
pub mod datasets;
pub mod embeddings;
pub mod endpoints;
pub mod files;
pub mod fine_tuning;
pub mod generate;
pub mod health;
pub mod images;
pub mod metrics;
pub mod models;
pub mod rerank;
pub mod responses;
mod responses_stream;
pub mod sse;
pub mod usage;

/// The answer for a model `id` that is not `what` (e.g. "a chat model"):
/// 400 naming `model` and the routes it serves when it is served as
/// another kind, else 404.
pub(crate) fn not_this_kind(
    state: &crate::state::AppState,
    id: &str,
    what: &str,
) -> crate::error::HttpError {
    use hearth_api::ApiError;
    let serves = if state.chat.contains_key(id) || state.adapters.contains_key(id) {
        "chat and completions"
    } else if state.embed.contains_key(id) {
        "/v1/embeddings and /v1/rerank"
    } else if state.images.contains_key(id) {
        "/v1/images/generations"
    } else {
        return crate::error::HttpError(ApiError::model_not_found(id));
    };
    crate::error::HttpError(ApiError::bad_request(
        Some("model"),
        format!("`{id}` is not {what}: it serves {serves}."),
    ))
}
