//! `/v1/responses`: create (whole or as typed events), retrieve, delete and
//! list the input items of stored responses.
//!
//! A response runs exactly as a chat completion with one choice: the same
//! model resolution (adapters included), chat template, limits, engine
//! submission and error mapping (`routes/generate.rs`); only the wire
//! format differs. With `store` (the default) the response, its input items
//! and the conversation through its output are kept per project;
//! `previous_response_id` continues that conversation (earlier
//! `instructions` are not carried over, as in OpenAI's API).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hearth_api::chat::ChatTokenLogprob;
use hearth_api::responses::{
    chat_messages, check_outputs, native_messages, ConversationItem, FunctionToolCall,
    InputItemList, InputItemObject, InputItemsQuery, InputTokens, OutputText, ResponseDeleted,
    ResponseObject, ResponseRequest, ResponseUsage, RetrieveQuery, ValidResponse,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_core::{ChatMessage, FinishReason};
use hearth_engine::{ChatModel, LoadedAdapter};
use hearth_store::{StoreError, StoredResponse};
use serde_json::Value;

use super::chat::{render, render_native};
use super::chat_tools::{call_id, with_tool_prompt};
use super::generate::{
    collect, constraint_for, random_hex, submit, tokenize, tool_constraint, Submission,
};
use super::responses_stream::{stream_response, Answer};
use super::sse::sse_response;
use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::models_resolve::resolve_chat;
use crate::state::{now_secs, AppState};

/// `resp_...`, `msg_...`, `fc_...`: OpenAI's id shapes.
pub(crate) fn openai_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex())
}

/// A request past the route's checks.
pub(crate) struct Prepared {
    pub valid: ValidResponse,
    pub model: ChatModel,
    pub adapter: Option<LoadedAdapter>,
    /// The conversation so far (the previous response's, if any) and this
    /// turn's input.
    pub conversation: Vec<ConversationItem>,
}

/// What the route checks before it renders anything: the request's
/// fields, the model (with its adapter), the previous response (the
/// caller's) and the conversation's limits. Batches check their lines
/// with it.
pub(crate) async fn prepare(
    state: &AppState,
    ctx: &RequestContext,
    request: ResponseRequest,
) -> Result<Prepared, HttpError> {
    let mut valid = request.validate()?;
    let (model, adapter) = resolve_chat(state, &ctx.project_id, &valid.model).await?;
    if let (true, Some(tools)) = (model.template.tagged_tool_calls(), valid.tools.as_mut()) {
        tools.format = hearth_api::tools::CallFormat::Tagged;
    }
    let mut conversation = match &valid.previous_response_id {
        Some(id) => previous_conversation(state, ctx, id).await?,
        None => Vec::new(),
    };
    check_outputs(&conversation, &valid.input)?;
    conversation.extend(valid.input.iter().cloned());
    let messages = template_messages(&valid, &conversation);
    state.limits.check_messages(&messages, 1)?;
    Ok(Prepared {
        valid,
        model,
        adapter,
        conversation,
    })
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(request): ApiJson<ResponseRequest>,
) -> Result<Response, HttpError> {
    respond(state, ctx, request, None).await
}

/// Answers a request: the route's work, under a new random id, or under
/// `id` when the caller names the response (a batch line's, the same on
/// every run of the line); a kept response of that id is then replaced.
pub(crate) async fn respond(
    state: AppState,
    ctx: RequestContext,
    request: ResponseRequest,
    id: Option<String>,
) -> Result<Response, HttpError> {
    let replace = id.is_some();
    let Prepared {
        valid,
        model,
        adapter,
        conversation,
    } = prepare(&state, &ctx, request).await?;
    let prompt = fit_prompt(&model, &valid, &conversation).await?;
    let constraint = match &valid.tools {
        Some(tools) => Some(tool_constraint(&model, tools).await?),
        None => constraint_for(&model, &valid.format, "text.format").await?,
    };
    let id = id.unwrap_or_else(|| openai_id("resp"));
    let prompts = [prompt];
    let streams = submit(Submission {
        model: &model,
        request_id: &id,
        prompts: &prompts,
        prompt_param: "input",
        params: &valid.params,
        max_tokens_param: valid.max_output_tokens.map(|_| "max_output_tokens"),
        n: 1,
        adapter: adapter.as_ref(),
        ctx: &ctx,
        model_name: &valid.model,
        ledger: &state.usage,
        constraint,
    })?;
    let [prompt] = prompts;
    let object = ResponseObject::start(id, now_secs(), &valid);
    let record = Record {
        state: state.clone(),
        project_id: ctx.project_id.clone(),
        keep: valid.store,
        replace,
        input_len: valid.input.len(),
        conversation,
    };
    let message_id = openai_id("msg");
    if valid.stream {
        let stream = streams.into_iter().next().map(|(_, s)| s);
        let answer = Answer {
            message_id,
            prompt_tokens: prompt.len(),
            tools: valid.tools,
            logprobs: valid.logprobs,
        };
        return Ok(sse_response(move |tx| async move {
            if let Some(stream) = stream {
                stream_response(tx, stream, object, answer, record).await;
            }
        }));
    }
    let outputs = collect(streams).await?;
    let out = outputs
        .into_iter()
        .next()
        .ok_or(HttpError(ApiError::internal()))?;
    let mut object = object;
    let usage = ResponseUsage::new(
        prompt.len(),
        out.usage.completion_tokens,
        out.usage.cached_tokens,
    );
    match function_calls(valid.tools.as_ref(), &out.text, out.finish_reason) {
        Some(calls) => object.finish_calls(calls, usage),
        None => {
            let logprobs = valid
                .logprobs
                .then(|| out.logprobs.iter().map(ChatTokenLogprob::from).collect());
            object.finish(
                message_id,
                OutputText::new(out.text, logprobs),
                out.finish_reason == FinishReason::Length,
                usage,
            )
        }
    }
    record.keep(&object).await?;
    Ok(Json(object).into_response())
}

/// `POST /v1/responses/input_tokens`: the prompt a create with this body
/// would send the model, counted and not run (the same checks, template,
/// tools and `truncation`; fields that only shape the output are checked
/// and otherwise ignored).
pub async fn input_tokens(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(request): ApiJson<ResponseRequest>,
) -> Result<Json<InputTokens>, HttpError> {
    let Prepared {
        valid,
        model,
        conversation,
        ..
    } = prepare(&state, &ctx, request).await?;
    let prompt = fit_prompt(&model, &valid, &conversation).await?;
    Ok(Json(InputTokens::new(prompt.len())))
}

/// The model's answer as function calls, when tools were offered and it
/// answered (to its end) with calls.
pub(crate) fn function_calls(
    tools: Option<&hearth_api::tools::ValidTools>,
    text: &str,
    reason: FinishReason,
) -> Option<Vec<FunctionToolCall>> {
    if reason != FinishReason::Stop {
        return None;
    }
    let calls = tools?.calls_in(text, call_id)?;
    Some(
        calls
            .into_iter()
            .map(|c| FunctionToolCall {
                id: openai_id("fc"),
                call_id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
                status: "completed".to_string(),
            })
            .collect(),
    )
}

/// The messages the template sees: `instructions` as a system message
/// first, with the tools described in it when there are tools.
fn template_messages(valid: &ValidResponse, conversation: &[ConversationItem]) -> Vec<ChatMessage> {
    let system = valid.instructions.as_deref().map(|text| ChatMessage {
        role: "system".to_string(),
        content: text.to_string(),
    });
    let messages: Vec<ChatMessage> = system
        .into_iter()
        .chain(chat_messages(conversation))
        .collect();
    match &valid.tools {
        Some(tools) => with_tool_prompt(&messages, tools),
        None => messages,
    }
}

/// The conversation rendered by the model's template: in the form it
/// takes when it knows tools, else with Hearth's tool prompt.
async fn render_conversation(
    model: &ChatModel,
    valid: &ValidResponse,
    conversation: &[ConversationItem],
) -> Result<String, HttpError> {
    if !model.template.tagged_tool_calls() {
        return render(model, &template_messages(valid, conversation)).await;
    }
    let system = valid
        .instructions
        .as_deref()
        .map(|text| serde_json::json!({"role": "system", "content": text}));
    let messages: Vec<Value> = system
        .into_iter()
        .chain(native_messages(conversation))
        .collect();
    let tools = valid.tools.as_ref().map(|t| t.template_tools());
    render_native(model, &messages, tools).await
}

/// The prompt's token ids. With `truncation: auto` the oldest messages are
/// dropped (the last always stays) until the prompt and the output budget
/// fit the context; without (or when even the last message does not fit),
/// the engine and the limits answer as for chat, naming `input` or
/// `max_output_tokens`, whichever leaves no room.
async fn fit_prompt(
    model: &ChatModel,
    valid: &ValidResponse,
    conversation: &[ConversationItem],
) -> Result<Vec<u32>, HttpError> {
    let context = model.engine.context_length();
    let budget = valid.params.max_tokens.unwrap_or(1);
    let mut skip = 0;
    loop {
        let text = render_conversation(model, valid, &conversation[skip..]).await?;
        let ids = tokenize(model.tokenizer.clone(), vec![text], false)
            .await?
            .pop()
            .unwrap_or_default();
        let fits = ids.len().saturating_add(budget) <= context;
        if fits || !valid.truncate || skip + 1 >= conversation.len() {
            return Ok(ids);
        }
        skip += 1;
    }
}

/// The conversation of the stored response `id`, which must be in the
/// request's project (else 400 naming `previous_response_id`).
async fn previous_conversation(
    state: &AppState,
    ctx: &RequestContext,
    id: &str,
) -> Result<Vec<ConversationItem>, HttpError> {
    let missing = || {
        HttpError(ApiError::bad_request(
            Some("previous_response_id"),
            format!("Previous response with id `{id}` not found in this project."),
        ))
    };
    let stored = match state.store.response_by_id(id).await {
        Ok(r) if r.project_id == ctx.project_id => r,
        Ok(_) | Err(StoreError::NotFound(_)) => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    let items = stored
        .conversation
        .as_array()
        .ok_or(HttpError(ApiError::internal()))?;
    Ok(items.iter().map(ConversationItem::from_stored).collect())
}

/// What is kept of a response once it has ended (when `store`).
pub struct Record {
    pub state: AppState,
    pub project_id: String,
    pub keep: bool,
    /// Whether a kept response of the same id is replaced (a batch line's
    /// rerun) rather than refused.
    pub replace: bool,
    /// How many of the conversation's last messages are this turn's input.
    pub input_len: usize,
    /// Through this turn's input.
    pub conversation: Vec<ConversationItem>,
}

impl Record {
    /// Stores the ended response (nothing unless `store`).
    pub async fn keep(self, object: &ResponseObject) -> Result<(), HttpError> {
        if !self.keep {
            return Ok(());
        }
        let conversation: Vec<Value> = self
            .conversation
            .iter()
            .chain(object.turns().iter())
            .map(ConversationItem::to_stored)
            .collect();
        let input = &self.conversation[self.conversation.len() - self.input_len..];
        let items: Vec<InputItemObject> = input
            .iter()
            .map(|m| InputItemObject::new(m, openai_id))
            .collect();
        let stored = StoredResponse {
            id: object.id.clone(),
            project_id: self.project_id,
            created_at: object.created_at as i64,
            previous_response_id: object.previous_response_id.clone(),
            // Through the text, so that numbers (log-probabilities are f32)
            // read back exactly as the response gave them.
            body: serde_json::to_string(object)
                .and_then(|text| serde_json::from_str(&text))
                .map_err(|_| HttpError(ApiError::internal()))?,
            input_items: serde_json::to_value(items)
                .map_err(|_| HttpError(ApiError::internal()))?,
            conversation: Value::Array(conversation),
        };
        if self.replace {
            self.state.store.replace_response(&stored).await?;
        } else {
            self.state.store.create_response(&stored).await?;
        }
        Ok(())
    }
}

/// The stored response `id` in any project the caller may use.
async fn caller_response(
    state: &AppState,
    ctx: &RequestContext,
    id: &str,
) -> Result<StoredResponse, HttpError> {
    let stored = state.store.response_by_id(id).await?;
    ctx.check_owner(&state.store, &stored.project_id, "response")
        .await?;
    Ok(stored)
}

/// `GET /v1/responses/{response_id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<RetrieveQuery>,
) -> Result<Json<Value>, HttpError> {
    if query.stream == Some(true) {
        return Err(HttpError(ApiError::bad_request(
            Some("stream"),
            "Only a response created with `background` can be streamed again, and this server runs none in the background; retrieve it without `stream`.",
        )));
    }
    Ok(Json(caller_response(&state, &ctx, &id).await?.body))
}

/// `DELETE /v1/responses/{response_id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ResponseDeleted>, HttpError> {
    let stored = caller_response(&state, &ctx, &id).await?;
    state
        .store
        .delete_response(&stored.project_id, &stored.id)
        .await?;
    Ok(Json(ResponseDeleted {
        id,
        object: "response.deleted".to_string(),
        deleted: true,
    }))
}

/// `GET /v1/responses/{response_id}/input_items`: newest first unless
/// `order=asc`; `limit` 1 to 100 (default 20); `after` an item id.
pub async fn input_items(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<InputItemsQuery>,
) -> Result<Json<InputItemList>, HttpError> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(HttpError(ApiError::bad_request(
            Some("limit"),
            format!("`limit` must be between 1 and 100, got {limit}."),
        )));
    }
    let ascending = match query.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(HttpError(ApiError::bad_request(
                Some("order"),
                format!("`order` must be `asc` or `desc`, got `{other}`."),
            )))
        }
    };
    let stored = caller_response(&state, &ctx, &id).await?;
    let mut items: Vec<InputItemObject> =
        serde_json::from_value(stored.input_items).map_err(|_| HttpError(ApiError::internal()))?;
    if !ascending {
        items.reverse();
    }
    let start = match &query.after {
        Some(after) => match items.iter().position(|i| i.id() == after) {
            Some(at) => at + 1,
            None => {
                return Err(HttpError(ApiError::bad_request(
                    Some("after"),
                    format!("No input item `{after}` in this response."),
                )))
            }
        },
        None => 0,
    };
    let rest: Vec<InputItemObject> = items.into_iter().skip(start).collect();
    let has_more = rest.len() > limit as usize;
    let page = rest.into_iter().take(limit as usize).collect();
    Ok(Json(InputItemList::new(page, has_more)))
}
