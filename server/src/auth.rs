//! Bearer-key authentication for every route but `/health`.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;

use crate::error::HttpError;
use crate::state::AppState;

pub async fn require_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match check(&state, request.headers().get(AUTHORIZATION)) {
        Ok(()) => next.run(request).await,
        Err(detail) => HttpError(ApiError::unauthorized(detail)).into_response(),
    }
}

fn check(state: &AppState, header: Option<&axum::http::HeaderValue>) -> Result<(), &'static str> {
    let header = header.ok_or("Not authenticated: the Authorization header is missing. Send `Authorization: Bearer <API key>`.")?;
    let value = header
        .to_str()
        .map_err(|_| "Not authenticated: the Authorization header is not valid text.")?;
    let (scheme, key) = value
        .split_once(' ')
        .ok_or("Not authenticated: the Authorization header must be `Bearer <API key>`.")?;
    if !scheme.eq_ignore_ascii_case("bearer") || key.trim().is_empty() {
        return Err("Not authenticated: the Authorization header must be `Bearer <API key>`.");
    }
    let key = key.trim().as_bytes();
    if state
        .api_keys
        .iter()
        .any(|k| constant_time_eq(k.as_bytes(), key))
    {
        Ok(())
    } else {
        Err("Invalid API key: the key sent is not valid for this server.")
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_keys_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
