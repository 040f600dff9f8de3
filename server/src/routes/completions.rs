//! `POST /v1/completions`: text completion, whole or streamed.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hearth_api::{
    ApiError, CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest,
    CompletionResponse, ProjectQuery, PromptInput, ValidCompletion,
};

use super::generate::{
    collect, response_id, stream_choices, submit, tokenize, ChoiceSlot, Piece, Submission,
    UsageTally,
};
use super::sse::{sse_response, SseSender};
use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::models_resolve::resolve_chat;
use crate::state::{now_secs, AppState};

pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(request): ApiJson<CompletionRequest>,
) -> Result<Response, HttpError> {
    let (valid, model, adapter) = prepare(&state, &ctx.project_id, request).await?;
    let prompts = prompt_ids(&model, &valid).await?;
    let constraint = super::generate::constraint_for(&model, &valid.format, "guided_json").await?;
    let echoes = if valid.echo {
        decode_all(&model, &prompts).await?
    } else {
        vec![String::new(); prompts.len()]
    };
    let id = response_id("cmpl");
    let streams = submit(Submission {
        model: &model,
        request_id: &id,
        prompts: &prompts,
        prompt_param: "prompt",
        params: &valid.params,
        max_tokens_param: valid.max_tokens_param,
        n: valid.n,
        adapter: adapter.as_ref(),
        ctx: &ctx,
        model_name: &valid.model,
        ledger: &state.usage,
        constraint,
    })?;
    let created = now_secs();
    if valid.stream {
        let want_logprobs = valid.logprobs.is_some();
        let (include_usage, model_id) = (valid.include_usage, valid.model.clone());
        return Ok(sse_response(move |tx| async move {
            stream_completion(
                tx,
                streams,
                id,
                created,
                model_id,
                prompts,
                echoes,
                include_usage,
                want_logprobs,
            )
            .await
        }));
    }
    let outputs = collect(streams).await?;
    let usage = UsageTally::of(&outputs).total(&prompts);
    let choices = outputs
        .into_iter()
        .map(|o| {
            let echo = &echoes[o.slot.prompt];
            CompletionChoice {
                index: o.slot.index,
                logprobs: valid
                    .logprobs
                    .map(|_| CompletionLogprobs::from_tokens(&o.logprobs, echo.len())),
                text: format!("{echo}{}", o.text),
                finish_reason: Some(o.finish_reason),
            }
        })
        .collect();
    let body = CompletionResponse::new(id, created, valid.model, choices, usage);
    Ok(Json(body).into_response())
}

/// What the route checks before it tokenizes anything: the request's
/// fields and limits, and the model (with its adapter). Batches check
/// their lines with it.
pub(crate) async fn prepare(
    state: &AppState,
    project: &str,
    request: CompletionRequest,
) -> Result<
    (
        ValidCompletion,
        hearth_engine::ChatModel,
        Option<hearth_engine::LoadedAdapter>,
    ),
    HttpError,
> {
    let valid = request.validate()?;
    state.limits.check_prompts(&valid.prompts, valid.n)?;
    state.limits.check_stop(&valid.params.stop)?;
    let (model, adapter) = resolve_chat(state, project, &valid.model).await?;
    Ok((valid, model, adapter))
}

/// Token ids of each prompt: text is tokenized (with the model's BOS rule),
/// token prompts are taken as they are.
async fn prompt_ids(
    model: &hearth_engine::ChatModel,
    valid: &ValidCompletion,
) -> Result<Vec<Vec<u32>>, HttpError> {
    let texts: Vec<String> = valid
        .prompts
        .iter()
        .filter_map(|p| match p {
            PromptInput::Text(t) => Some(t.clone()),
            PromptInput::Tokens(_) => None,
        })
        .collect();
    let mut encoded = tokenize(model.tokenizer.clone(), texts, true)
        .await?
        .into_iter();
    Ok(valid
        .prompts
        .iter()
        .map(|p| match p {
            PromptInput::Text(_) => encoded.next().unwrap_or_default(),
            PromptInput::Tokens(ids) => ids.clone(),
        })
        .collect())
}

async fn decode_all(
    model: &hearth_engine::ChatModel,
    prompts: &[Vec<u32>],
) -> Result<Vec<String>, HttpError> {
    let tokenizer = model.tokenizer.clone();
    let prompts = prompts.to_vec();
    tokio::task::spawn_blocking(move || {
        prompts
            .iter()
            .map(|ids| tokenizer.decode(ids, false).unwrap_or_default())
            .collect()
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))
}

#[allow(clippy::too_many_arguments)]
async fn stream_completion(
    tx: SseSender,
    streams: Vec<(ChoiceSlot, super::generate::MeteredStream)>,
    id: String,
    created: u64,
    model: String,
    prompts: Vec<Vec<u32>>,
    echoes: Vec<String>,
    include_usage: bool,
    want_logprobs: bool,
) {
    let chunk = |choice: CompletionChoice| {
        CompletionChunk::new(id.clone(), created, model.clone(), vec![choice])
    };
    // Character offset of the next text in each choice (for `text_offset`).
    let mut offsets = vec![0usize; streams.len()];
    for (slot, _) in &streams {
        let echo = &echoes[slot.prompt];
        if !echo.is_empty() {
            offsets[slot.index] = echo.chars().count();
            let choice = CompletionChoice {
                index: slot.index,
                text: echo.clone(),
                logprobs: None,
                finish_reason: None,
            };
            if !tx.json(&chunk(choice)).await {
                return;
            }
        }
    }
    let render = |slot: ChoiceSlot, piece: Piece| {
        let choice = match piece {
            Piece::Token { text, logprobs } => {
                let logprobs = logprobs.filter(|_| want_logprobs).map(|lp| {
                    CompletionLogprobs::from_tokens(std::slice::from_ref(&lp), offsets[slot.index])
                });
                if text.is_empty() && logprobs.is_none() {
                    return vec![];
                }
                offsets[slot.index] += text.chars().count();
                CompletionChoice {
                    index: slot.index,
                    text,
                    logprobs,
                    finish_reason: None,
                }
            }
            Piece::Finished { reason, text } => CompletionChoice {
                index: slot.index,
                text,
                logprobs: None,
                finish_reason: Some(reason),
            },
        };
        vec![chunk(choice)]
    };
    let usage = include_usage
        .then_some(|usage| CompletionChunk::usage(id.clone(), created, model.clone(), usage));
    stream_choices(&tx, streams, &prompts, render, usage).await;
}
