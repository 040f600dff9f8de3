//! The HTTP edge of errors: [`HttpError`] turns the API layer's errors into
//! responses, and the extractors here make sure axum's own plain-text
//! rejections never reach a client.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use serde::de::DeserializeOwned;

/// An [`ApiError`] on its way out as an HTTP response.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<hearth_core::EngineError> for HttpError {
    fn from(e: hearth_core::EngineError) -> Self {
        Self(ApiError::from(e))
    }
}

/// The body of a 5xx answer, for the one log line of the failed request.
#[derive(Clone)]
pub struct FailureBody(pub String);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.0.body_json();
        // Logged once, with the request's id, by `layers::request_id`.
        let failure = status
            .is_server_error()
            .then(|| FailureBody(body.to_string()));
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(failure) = failure {
            response.extensions_mut().insert(failure);
        }
        if let Some(secs) = self.0.retry_after() {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// Whether the request's `Content-Length` already says its body is over
/// `limit` (refused before any of it is read).
pub fn declared_too_large(headers: &axum::http::HeaderMap, limit: usize) -> bool {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64)
}

/// The answer for a request body that could not be read (`err` and its
/// causes): 413 over `limit`, 408 when it stopped arriving for
/// `--body-timeout-secs`, else 400 (cut short, a broken chunked encoding).
pub fn body_error(err: &(dyn std::error::Error + 'static), limit: usize) -> HttpError {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return HttpError(ApiError::payload_too_large(limit));
        }
        if e.is::<tower_http::timeout::TimeoutError>() {
            return HttpError(ApiError::with_detail(
                408,
                "The request body stopped arriving before its end; send it again.",
            ));
        }
        cause = e.source();
    }
    HttpError(ApiError::bad_request(
        None,
        "The request body could not be read: it ended before its declared length or its \
         chunked encoding is broken.",
    ))
}

/// A JSON body parsed into the API's own error shapes (422 shape C).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = crate::app::MAX_BODY_BYTES;
        if declared_too_large(req.headers(), limit) {
            return Err(HttpError(ApiError::payload_too_large(limit)));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                HttpError(ApiError::payload_too_large(limit))
            } else {
                body_error(&rejection, limit)
            }
        })?;
        hearth_api::parse_json_body(&bytes)
            .map(ApiJson)
            .map_err(HttpError)
    }
}

/// A query string parsed into the API's own error shapes (422 shape C).
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        hearth_api::parse_query(parts.uri.query())
            .map(ApiQuery)
            .map_err(HttpError)
    }
}

/// Path parameters parsed into the API's own error shapes: a segment that
/// does not decode (e.g. `%FF`, not UTF-8) is 422 shape C at
/// `["path", <name>]`, never axum's plain text.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => {
                let name = match &rejection {
                    axum::extract::rejection::PathRejection::FailedToDeserializePathParams(e) => {
                        match e.kind() {
                            axum::extract::path::ErrorKind::InvalidUtf8InPathParam { key } => {
                                key.clone()
                            }
                            axum::extract::path::ErrorKind::ParseErrorAtKey { key, .. } => {
                                key.clone()
                            }
                            _ => String::new(),
                        }
                    }
                    _ => String::new(),
                };
                let mut loc = vec![hearth_api::Loc::from("path")];
                if !name.is_empty() {
                    loc.push(hearth_api::Loc::Key(name));
                }
                Err(HttpError(ApiError::validation(vec![
                    hearth_api::ValidationItem {
                        kind: "string_unicode".into(),
                        loc,
                        msg: format!("Invalid path parameter: {}", rejection.body_text()),
                        input: serde_json::Value::Null,
                        ctx: None,
                    },
                ])))
            }
        }
    }
}

/// 404 for unknown routes, in shape A.
pub async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({"detail": "Not Found"})),
    )
        .into_response()
}

/// 405 for a known route with the wrong method, in shape A.
pub async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(serde_json::json!({"detail": "Method Not Allowed"})),
    )
        .into_response()
}

/// The store's errors, mapped to HTTP once: a missing resource and one of
/// another project look the same (403); a file in use is 409; an upload
/// over the limit 413; anything else from the database or the blob store
/// is logged and answered 500. All shape A.
impl From<hearth_store::StoreError> for HttpError {
    fn from(e: hearth_store::StoreError) -> Self {
        use hearth_store::StoreError as E;
        Self(match &e {
            E::NotFound(kind) => {
                ApiError::forbidden(format!("No access to this {kind}, or it does not exist."))
            }
            E::InUse(detail) => ApiError::with_detail(409, detail.clone()),
            E::TooLarge { limit } => ApiError::with_detail(
                413,
                format!("The file is larger than the limit of {limit} bytes."),
            ),
            E::Invalid(detail) => ApiError::with_detail(400, detail.clone()),
            E::Interrupted(detail) => {
                ApiError::with_detail(400, format!("The upload was interrupted: {detail}"))
            }
            E::Db(_) | E::Migrate(_) | E::Blob(_) | E::Io(_) | E::Table(_) => {
                tracing::error!("store: {e}");
                ApiError::internal()
            }
        })
    }
}
