//! The axum application: `app(state) -> Router`, testable in-process.

use std::panic::AssertUnwindSafe;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::FutureExt;
use hearth_api::ApiError;

use crate::auth::require_key;
use crate::error::{method_not_allowed, not_found, HttpError};
use crate::routes;
use crate::state::AppState;

/// Largest request body accepted (prompts of the whole context fit easily).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/models", get(routes::models::list))
        .route("/v1/completions", post(routes::completions::create))
        .route("/v1/chat/completions", post(routes::chat::create))
        .route("/v1/embeddings", post(routes::embeddings::create))
        .route("/v1/rerank", post(routes::rerank::create))
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics::metrics))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(catch_panic))
        .with_state(state)
}

/// A bug in a handler answers 500 in shape A instead of dropping the connection.
async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked");
            HttpError(ApiError::internal()).into_response()
        }
    }
}
