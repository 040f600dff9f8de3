//! `POST /v1/rerank`. A cross-encoder (catalogue kind `rerank`) reads the
//! query with each document as a sentence pair and scores it (sigmoid of
//! its logit); the pairs go through the model's batcher as one job and are
//! cut longest-first to the model's maximum length. An embedding model
//! serves as a bi-encoder: the query and the documents are embedded in one
//! job and each document is scored by the cosine similarity of its vector
//! with the query's; texts over the maximum length are truncated.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::{ApiError, ProjectQuery, PromptInput, RerankRequest, RerankResponse};
use hearth_engine::cross_encoder::pair_items;
use hearth_engine::embed::cosine;

use super::embeddings::{embed_model, token_inputs};
use super::generate::response_id;
use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(request): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, HttpError> {
    let valid = request.validate()?;
    let model = embed_model(&state, &ctx.project_id, &valid.model)?;
    if model.cross_encoder {
        let tokenizer = model.tokenizer.clone();
        let (query, documents) = (valid.query.clone(), valid.documents.clone());
        let items = tokio::task::spawn_blocking(move || pair_items(&tokenizer, &query, &documents))
            .await
            .map_err(|_| HttpError(ApiError::internal()))?
            .map_err(|e| {
                HttpError(ApiError::bad_request(
                    Some("documents"),
                    format!("The query and documents cannot be tokenized: {e}"),
                ))
            })?;
        let prompt_tokens = items.iter().map(|i| i.ids.len()).sum();
        let encoded = model.encoder.encode_items(items);
        let scores: Vec<f32> = state
            .usage
            .encode(&ctx, &valid.model, &model.entry, prompt_tokens, encoded)
            .await?
            .into_iter()
            .map(|v| v.first().copied().unwrap_or(0.0))
            .collect();
        return Ok(Json(RerankResponse::new(
            response_id("rerank"),
            valid.model.clone(),
            &valid,
            &scores,
            prompt_tokens,
        )));
    }
    let texts = std::iter::once(&valid.query)
        .chain(&valid.documents)
        .map(|t| PromptInput::Text(t.clone()))
        .collect();
    let ids = token_inputs(&model, texts, true).await?;
    let prompt_tokens = ids.iter().map(Vec::len).sum();
    let encoded = model.encoder.encode(ids);
    let vectors = state
        .usage
        .encode(&ctx, &valid.model, &model.entry, prompt_tokens, encoded)
        .await?;
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
