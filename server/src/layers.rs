//! The middleware around every route: a global concurrency limit, a
//! whole-request timeout for the routes that neither generate nor stream
//! files, an idle limit on request bodies, CORS, panics answered 500, and
//! an `x-request-id` on every response.
//! Every refusal is JSON in shape A.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::FutureExt;
use hearth_api::ApiError;
use tokio::sync::Semaphore;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::error::HttpError;
use crate::iam::CloudHttpError;
use crate::state::{AppState, HttpPolicy};
use hearth_api::cloud::{CloudCode, CloudError};

/// Wraps `router` (already holding its routes) in the layers, outermost
/// last: CORS answers preflights before anything else runs.
pub fn wrap(router: Router<AppState>, policy: &HttpPolicy) -> Router<AppState> {
    let mut router = router.layer(axum::middleware::from_fn(catch_panic));
    if let Some(idle) = policy.body_timeout {
        router = router.layer(RequestBodyTimeoutLayer::new(idle));
    }
    if policy.max_concurrent > 0 {
        let permits = Arc::new(Semaphore::new(policy.max_concurrent));
        router = router.layer(axum::middleware::from_fn_with_state(permits, limit));
    }
    router = router.layer(axum::middleware::from_fn(request_id));
    if let Some(cors) = cors(&policy.cors_origins) {
        router = router.layer(cors);
    }
    router
}

/// OpenAI's response header naming the request (the SDKs show it as
/// `_request_id`).
const X_REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");

/// Gives every response, refusals included, an `x-request-id`: `req_` and
/// 32 hex digits, also in the log line of a failed request.
async fn request_id(request: Request, next: Next) -> Response {
    let id = format!("req_{}", hearth_store::ids::random_hex());
    let mut response = next.run(request).await;
    if response.status().is_server_error() {
        let body = response
            .extensions()
            .get::<crate::error::FailureBody>()
            .map_or("", |b| b.0.as_str());
        let status = response.status().as_u16();
        tracing::warn!(request_id = %id, status, body, "request failed");
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID, value);
    }
    response
}

/// Answers 503 at once when `--max-concurrent-requests` are in flight (a
/// streamed response counts until its headers are sent). Health probes and
/// `/metrics` never wait on it: a busy server is not a dead one, and its
/// counters matter most then.
async fn limit(State(permits): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path == "/metrics" || path == "/health" || path.starts_with("/health/") {
        return next.run(request).await;
    }
    let cloud = is_cloud(request.uri().path());
    match permits.try_acquire() {
        Ok(_permit) => next.run(request).await,
        Err(_) => {
            let message = "The server is handling as many requests as it allows; retry shortly.";
            let mut response = if cloud {
                CloudHttpError(CloudError::new(CloudCode::Unavailable, message)).into_response()
            } else {
                HttpError(ApiError::upstream_unavailable(message)).into_response()
            };
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// Whether a request may run as long as it needs: generation (text
/// streamed or not, responses, images; the console's playground and images
/// too), uploads (files, the console's file form, dataset parts) and
/// downloads (file contents, dataset exports).
fn unbounded(method: &Method, path: &str) -> bool {
    match *method {
        Method::POST => {
            matches!(
                path,
                "/v1/chat/completions"
                    | "/v1/completions"
                    | "/v1/responses"
                    | "/v1/images/generations"
                    | "/console/images"
                    | "/v1/files"
                    | "/console/files"
                    | "/console/playground"
                    | "/console/playground/stream"
            ) || (path.starts_with("/v1/datasets/uploads/") && path.ends_with("/parts"))
        }
        Method::GET => {
            path.ends_with("/content") || path.ends_with("/download") || path.ends_with("/export")
        }
        _ => false,
    }
}

/// `--request-timeout-secs` on the bounded routes: 503 shape A when over.
pub async fn request_timeout(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(limit) = state.http.request_timeout else {
        return next.run(request).await;
    };
    if unbounded(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let cloud = is_cloud(request.uri().path());
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let message = format!(
                "The request took longer than {} seconds and was stopped.",
                limit.as_secs()
            );
            if cloud {
                CloudHttpError(CloudError::new(CloudCode::DeadlineExceeded, message))
                    .into_response()
            } else {
                HttpError(ApiError::upstream_unavailable(message)).into_response()
            }
        }
    }
}

/// Whether `path` is the cloud platform API's, whose errors are `{code, message}`.
fn is_cloud(path: &str) -> bool {
    path == "/iam" || path.starts_with("/iam/") || path.starts_with("/oauth2/")
}

/// A bug in a handler answers 500 in shape A instead of dropping the connection.
async fn catch_panic(request: Request, next: Next) -> Response {
    let cloud = is_cloud(request.uri().path());
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked");
            if cloud {
                CloudHttpError(CloudError::internal()).into_response()
            } else {
                HttpError(ApiError::internal()).into_response()
            }
        }
    }
}

/// The CORS layer for `origins` (`*` allows any); `None` without origins.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
            .collect();
        AllowOrigin::list(values)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::PATCH, Method::DELETE])
            // The SDKs send headers of their own (`x-stainless-*`, ...).
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([X_REQUEST_ID])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_uploads_and_downloads_are_unbounded() {
        for path in [
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/images/generations",
            "/console/images",
            "/v1/files",
            "/v1/datasets/uploads/dsupload-1/parts",
        ] {
            assert!(unbounded(&Method::POST, path), "{path}");
        }
        assert!(unbounded(&Method::GET, "/v1/files/file-1/content"));
        assert!(!unbounded(&Method::POST, "/v1/embeddings"));
        assert!(!unbounded(&Method::GET, "/v1/files"));
        assert!(!unbounded(&Method::DELETE, "/v1/files/file-1"));
    }
}
