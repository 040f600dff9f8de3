//! `POST /v1/embeddings`, and what rerank shares with it: finding the
//! embedding model and turning inputs into token ids within its limits.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::{
    apply_dimensions, dimensions_too_large, ApiError, EmbeddingList, EmbeddingRequest,
    ProjectQuery, PromptInput, ValidEmbedding,
};
use hearth_engine::EmbedModel;

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(request): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingList>, HttpError> {
    let (valid, model) = prepare(&state, &ctx.project_id, request)?;
    let ids = token_inputs(&model, valid.inputs, valid.truncate).await?;
    let prompt_tokens = ids.iter().map(Vec::len).sum();
    let encoded = model.encoder.encode(ids);
    let mut vectors = state
        .usage
        .encode(&ctx, &valid.model, &model.entry, prompt_tokens, encoded)
        .await?;
    if let Some(d) = valid.dimensions.filter(|&d| d < model.dimensions) {
        vectors = vectors.iter().map(|v| apply_dimensions(v, d)).collect();
    }
    Ok(Json(EmbeddingList::new(
        valid.model,
        &vectors,
        valid.encoding_format,
        prompt_tokens,
    )))
}

/// What the route checks before it tokenizes anything: the request's
/// fields, the model (an embedding model, not a cross-encoder) and
/// `dimensions`. Batches check their lines with it.
pub(crate) fn prepare(
    state: &AppState,
    project: &str,
    request: EmbeddingRequest,
) -> Result<(ValidEmbedding, EmbedModel), HttpError> {
    let valid = request.validate()?;
    let model = embed_model(state, project, &valid.model)?;
    if model.cross_encoder {
        return Err(HttpError(ApiError::bad_request(
            Some("model"),
            format!(
                "`{}` is a rerank model (a cross-encoder): it scores query-document pairs at /v1/rerank and gives no embeddings.",
                valid.model
            ),
        )));
    }
    if let Some(d) = valid.dimensions {
        if d > model.dimensions {
            return Err(HttpError(dimensions_too_large(d, model.dimensions)));
        }
    }
    Ok((valid, model))
}

/// Finds a served embedding model, or the project's embedding endpoint of
/// that routing key: 400 shape B for a chat or image model, else 404 shape A.
pub fn embed_model(state: &AppState, project: &str, id: &str) -> Result<EmbedModel, HttpError> {
    if let Some(model) = state.embed.get(id) {
        return Ok(model.clone());
    }
    if let Some(routed) = state.endpoints.route_embed(project, id) {
        return routed.map_err(HttpError);
    }
    Err(super::not_this_kind(state, id, "an embedding model"))
}

/// Token ids of each input: texts tokenized (with the model's special
/// tokens) on the blocking pool, id lists checked against the vocabulary.
/// An input over the model's maximum is cut when `truncate` (a text keeps its
/// closing special token, e.g. [SEP]), else 400 naming the input's index.
pub async fn token_inputs(
    model: &EmbedModel,
    inputs: Vec<PromptInput>,
    truncate: bool,
) -> Result<Vec<Vec<u32>>, HttpError> {
    let tokenizer = model.tokenizer.clone();
    let (max, vocab) = (model.max_tokens, model.vocab_size);
    tokio::task::spawn_blocking(move || {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let (mut ids, keep_last) = match input {
                    PromptInput::Text(text) => {
                        let encoding = tokenizer.encode(text, true).map_err(|e| {
                            ApiError::bad_request(
                                Some("input"),
                                format!("Input {i} cannot be tokenized: {e}"),
                            )
                        })?;
                        let closing_special =
                            encoding.get_special_tokens_mask().last() == Some(&1);
                        (encoding.get_ids().to_vec(), closing_special)
                    }
                    PromptInput::Tokens(ids) => {
                        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                            return Err(ApiError::bad_request(
                                Some("input"),
                                format!("Input {i} holds token id {bad}, outside the model's vocabulary of {vocab}."),
                            ));
                        }
                        (ids, false)
                    }
                };
                if ids.len() > max {
                    if !truncate {
                        return Err(ApiError::bad_request(
                            Some("input"),
                            format!(
                                "Input {i} has {} tokens, more than the model's maximum of {max}. \
                                 Shorten it, or pass `truncate: true` to cut it.",
                                ids.len()
                            ),
                        ));
                    }
                    let last = ids[ids.len() - 1];
                    ids.truncate(max);
                    if keep_last {
                        ids[max - 1] = last;
                    }
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))?
    .map_err(HttpError)
}
