//! HTTP routes, one module per endpoint family.

pub mod admin;
pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod files;
pub mod fine_tuning;
pub mod generate;
pub mod metrics;
pub mod models;
pub mod rerank;
pub mod sse;

use axum::Json;
use serde_json::{json, Value};

/// `GET /health`: no key needed; 200 while the server runs.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}
