//! `POST /v1/chat/completions`: chat, whole or streamed.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hearth_api::tools::{CallFormat, ValidTools};
use hearth_api::{
    ApiError, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ProjectQuery, ValidChat,
};
use hearth_core::ChatMessage;
use hearth_engine::{ChatModel, LoadedAdapter};

use super::chat_tools::{answer, stream_with_tools, with_tool_prompt};
use super::generate::{
    collect, constraint_for, response_id, stream_choices, submit, tokenize, tool_constraint,
    ChoiceSlot, Piece, Submission, UsageTally,
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
    ApiJson(request): ApiJson<ChatCompletionRequest>,
) -> Result<Response, HttpError> {
    let (mut valid, model, adapter) = prepare(&state, &ctx.project_id, request).await?;
    let native = model.template.tagged_tool_calls();
    if let (true, Some(tools)) = (native, valid.tools.as_mut()) {
        tools.format = CallFormat::Tagged;
    }
    let prompt = match (&valid.tools, native) {
        (tools, true) => {
            let tools = tools.as_ref().map(ValidTools::template_tools);
            render_native(&model, &valid.native_messages, tools).await?
        }
        (Some(tools), false) => render(&model, &with_tool_prompt(&valid.messages, tools)).await?,
        (None, false) => render(&model, &valid.messages).await?,
    };
    let constraint = match &valid.tools {
        Some(tools) => Some(tool_constraint(&model, tools).await?),
        None => constraint_for(&model, &valid.format, "response_format").await?,
    };
    let prompts = tokenize(model.tokenizer.clone(), vec![prompt], false).await?;
    let id = response_id("chatcmpl");
    let streams = submit(Submission {
        model: &model,
        request_id: &id,
        prompts: &prompts,
        prompt_param: "messages",
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
    if let (true, Some(tools)) = (valid.stream, valid.tools.clone()) {
        let include_usage = valid.include_usage;
        let model_id = valid.model.clone();
        return Ok(sse_response(move |tx| async move {
            let chunk = |choice: ChatChunkChoice| {
                ChatCompletionChunk::new(id.clone(), created, model_id.clone(), vec![choice])
            };
            let usage = include_usage.then_some(|usage| {
                ChatCompletionChunk::usage(id.clone(), created, model_id.clone(), usage)
            });
            stream_with_tools(tx, streams, tools, chunk, usage, prompts).await
        }));
    }
    if valid.stream {
        let include_usage = valid.include_usage;
        let model_id = valid.model.clone();
        return Ok(sse_response(move |tx| async move {
            stream_chat(tx, streams, id, created, model_id, prompts, include_usage).await
        }));
    }
    let outputs = collect(streams).await?;
    let usage = UsageTally::of(&outputs).total(&prompts);
    let choices = outputs
        .into_iter()
        .map(|o| {
            let (message, reason) = answer(valid.tools.as_ref(), o.text, o.finish_reason);
            ChatChoice {
                index: o.slot.index,
                logprobs: valid
                    .logprobs
                    .map(|_| ChatLogprobs::from_tokens(&o.logprobs)),
                message,
                finish_reason: Some(reason),
            }
        })
        .collect();
    let body = ChatCompletionResponse::new(id, created, valid.model, choices, usage);
    Ok(Json(body).into_response())
}

/// What the route checks before it renders anything: the request's
/// fields and limits, and the model (with its adapter). Batches check
/// their lines with it.
pub(crate) async fn prepare(
    state: &AppState,
    project: &str,
    request: ChatCompletionRequest,
) -> Result<(ValidChat, ChatModel, Option<LoadedAdapter>), HttpError> {
    let valid = request.validate()?;
    state.limits.check_messages(&valid.messages, valid.n)?;
    state.limits.check_stop(&valid.params.stop)?;
    let (model, adapter) = resolve_chat(state, project, &valid.model).await?;
    Ok((valid, model, adapter))
}

/// Renders the conversation with the model's chat template; a template error
/// (e.g. a role order the template refuses) is the client's: 400.
pub(crate) async fn render(
    model: &ChatModel,
    messages: &[ChatMessage],
) -> Result<String, HttpError> {
    let template = model.template.clone();
    let messages = messages.to_vec();
    tokio::task::spawn_blocking(move || template.render(&messages, true))
        .await
        .map_err(|_| HttpError(ApiError::internal()))?
        .map_err(|e| HttpError(ApiError::bad_request(Some("messages"), e.to_string())))
}

/// Renders messages in the form templates that know tools take, with the
/// callable `tools` (see `ChatTemplate::tagged_tool_calls`).
pub(crate) async fn render_native(
    model: &ChatModel,
    messages: &[serde_json::Value],
    tools: Option<serde_json::Value>,
) -> Result<String, HttpError> {
    let template = model.template.clone();
    let messages = messages.to_vec();
    tokio::task::spawn_blocking(move || template.render_with(&messages, true, tools.as_ref()))
        .await
        .map_err(|_| HttpError(ApiError::internal()))?
        .map_err(|e| HttpError(ApiError::bad_request(Some("messages"), e.to_string())))
}

async fn stream_chat(
    tx: SseSender,
    streams: Vec<(ChoiceSlot, super::generate::MeteredStream)>,
    id: String,
    created: u64,
    model: String,
    prompts: Vec<Vec<u32>>,
    include_usage: bool,
) {
    let chunk = |choice: ChatChunkChoice| {
        ChatCompletionChunk::new(id.clone(), created, model.clone(), vec![choice])
    };
    for (slot, _) in &streams {
        if !tx.json(&chunk(ChatChunkChoice::role(slot.index))).await {
            return;
        }
    }
    let render = |slot: ChoiceSlot, piece: Piece| match piece {
        Piece::Token { text, logprobs } => {
            let logprobs = logprobs.map(|lp| ChatLogprobs::from_tokens(std::slice::from_ref(&lp)));
            if text.is_empty() && logprobs.is_none() {
                return vec![];
            }
            vec![chunk(ChatChunkChoice::content(slot.index, text, logprobs))]
        }
        Piece::Finished { reason, text } => {
            let mut out = Vec::new();
            if !text.is_empty() {
                out.push(chunk(ChatChunkChoice::content(slot.index, text, None)));
            }
            out.push(chunk(ChatChunkChoice::finish(slot.index, reason)));
            out
        }
    };
    let usage = include_usage
        .then_some(|usage| ChatCompletionChunk::usage(id.clone(), created, model.clone(), usage));
    stream_choices(&tx, streams, &prompts, render, usage).await;
}
