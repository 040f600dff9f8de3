//! Health probes, no key needed: `/health/live` (the process answers and
//! every engine loop runs; restart it otherwise) and `/health/ready` (also
//! not shutting down; `/health` is the same). 503 with the reason when not.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::state::AppState;

/// Chat models whose engine stopped (after a panic).
fn dead_engines(state: &AppState) -> Vec<&str> {
    state
        .chat
        .iter()
        .filter(|(_, m)| !m.engine.is_alive())
        .map(|(id, _)| id.as_str())
        .collect()
}

fn answer(ok: bool, status: &str, dead: Vec<&str>) -> Response {
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({ "status": status });
    if !dead.is_empty() {
        body["dead_engines"] = json!(dead);
    }
    (code, Json(body)).into_response()
}

/// `GET /health/live`.
pub async fn live(State(state): State<AppState>) -> Response {
    let dead = dead_engines(&state);
    if dead.is_empty() {
        answer(true, "ok", dead)
    } else {
        answer(false, "engine stopped", dead)
    }
}

/// `GET /health/ready` and `GET /health`.
pub async fn ready(State(state): State<AppState>) -> Response {
    let dead = dead_engines(&state);
    if !dead.is_empty() {
        return answer(false, "engine stopped", dead);
    }
    if state
        .http
        .draining
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return answer(false, "shutting down", dead);
    }
    answer(true, "ok", dead)
}
