//! `POST /v1/rerank`. The served encoders are bi-encoders: the query and the
//! documents are embedded in one batcher job and each document is scored by
//! the cosine similarity of its vector with the query's. Documents (and a
//! query) over the model's maximum length are truncated.

use axum::extract::State;
use axum::Json;
use hearth_api::{ApiError, ProjectQuery, PromptInput, RerankRequest, RerankResponse};
use hearth_engine::embed::cosine;

use super::embeddings::{embed_model, token_inputs};
use super::generate::response_id;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(request): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, HttpError> {
    let valid = request.validate()?;
    let model = embed_model(&state, &valid.model)?;
    let texts = std::iter::once(&valid.query)
        .chain(&valid.documents)
        .map(|t| PromptInput::Text(t.clone()))
        .collect();
    let ids = token_inputs(&model, texts, true).await?;
    let prompt_tokens = ids.iter().map(Vec::len).sum();
    let vectors = model.encoder.encode(ids).await?;
    let (query, documents) = vectors
        .split_first()
        .ok_or_else(|| HttpError(ApiError::internal()))?;
    let scores: Vec<f32> = documents.iter().map(|d| cosine(query, d)).collect();
    Ok(Json(RerankResponse::new(
        response_id("rerank"),
        valid.model.clone(),
        &valid,
        &scores,
        prompt_tokens,
    )))
}
