//! What the completion and chat routes share: tokenizing off the async
//! threads, submitting one sequence per choice, merging the choices' event
//! streams, and collecting them into whole results.

use std::sync::Arc;

use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use hearth_api::output_format::OutputFormat;
use hearth_api::tools::{CallFormat, ValidTools};
use hearth_api::{ApiError, UsageInfo};
use hearth_core::{
    Constraint, EngineError, FinishReason, GenerateRequest, SamplingParams, TokenEvent,
    TokenLogprobs, Usage,
};
use hearth_engine::{ChatModel, LoadedAdapter, TokenStream};
use serde::Serialize;
use tokenizers::Tokenizer;

use super::sse::SseSender;
use crate::auth::RequestContext;
use crate::error::HttpError;
use crate::state::AppState;
use crate::usage::{Ledger, Ticket};

/// Finds a served chat model: 400 shape B for a served embedding or image
/// model, else 404 shape A.
pub fn chat_model(state: &AppState, id: &str) -> Result<ChatModel, HttpError> {
    if let Some(model) = state.chat.get(id) {
        return Ok(model.clone());
    }
    Err(super::not_this_kind(state, id, "a chat model"))
}

/// Tokenizes `texts` on the blocking pool.
pub async fn tokenize(
    tokenizer: Arc<Tokenizer>,
    texts: Vec<String>,
    add_special: bool,
) -> Result<Vec<Vec<u32>>, HttpError> {
    tokio::task::spawn_blocking(move || {
        texts
            .into_iter()
            .map(|t| {
                tokenizer
                    .encode(t, add_special)
                    .map(|e| e.get_ids().to_vec())
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))?
    .map_err(|e| {
        HttpError(ApiError::bad_request(
            Some("prompt"),
            format!("cannot tokenize the prompt: {e}"),
        ))
    })
}

/// The grammar of an output format (none for text): 400 shape B naming
/// `param` when the schema cannot be compiled.
pub async fn constraint_for(
    model: &ChatModel,
    format: &OutputFormat,
    param: &str,
) -> Result<Option<Arc<dyn Constraint>>, HttpError> {
    if *format == OutputFormat::Text {
        return Ok(None);
    }
    let (model, spec) = (model.clone(), format.clone());
    let compiled = tokio::task::spawn_blocking(move || {
        let compiler = model.grammar()?;
        match &spec {
            OutputFormat::Regex(regex) => compiler
                .regex(regex)
                .map_err(|e| format!("The regular expression cannot be used: {e}")),
            OutputFormat::Grammar(lark) => compiler
                .lark(lark)
                .map_err(|e| format!("The grammar cannot be used: {e}")),
            OutputFormat::Choice(choices) => {
                let quoted: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).unwrap_or_default())
                    .collect();
                compiler
                    .lark(&format!("start: {}", quoted.join(" | ")))
                    .map_err(|e| format!("The choices cannot be used: {e}"))
            }
            _ => compiler
                .json_schema(&spec.schema().unwrap_or_default())
                .map_err(|e| format!("The JSON schema cannot be used: {e}")),
        }
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))?;
    let param = format.guided_param().unwrap_or(param);
    compiled
        .map(|constraint| Some(from_field(constraint, param)))
        .map_err(|message| HttpError(ApiError::bad_request(Some(param), message)))
}

/// The grammar of a request's tool calls (see `hearth_api::tools`).
pub async fn tool_constraint(
    model: &ChatModel,
    tools: &ValidTools,
) -> Result<Arc<dyn Constraint>, HttpError> {
    let model = model.clone();
    let tools = tools.clone();
    let compiled = tokio::task::spawn_blocking(move || {
        let grammar = model.grammar()?;
        match tools.format {
            CallFormat::JsonArray => grammar.tool_calls(&tools.calls_schema(), tools.may_answer()),
            CallFormat::Tagged => grammar.tagged_tool_calls(
                &tools.call_schema(),
                tools.max_calls(),
                tools.may_answer(),
            ),
        }
        .map_err(|e| format!("The tools' parameter schemas cannot be used: {e}"))
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))?;
    compiled
        .map(|constraint| from_field(constraint, "tools"))
        .map_err(|message| HttpError(ApiError::bad_request(Some("tools"), message)))
}

/// `constraint`, naming `field` if the grammar engine gives up on it.
fn from_field(constraint: Arc<dyn Constraint>, field: &str) -> Arc<dyn Constraint> {
    Arc::new(hearth_core::FromField {
        constraint,
        field: field.to_string(),
    })
}

/// One choice's place: which prompt it answers and its index in `choices`.
#[derive(Debug, Clone, Copy)]
pub struct ChoiceSlot {
    pub index: usize,
    pub prompt: usize,
}

/// What a generation request submits: `n` sequences for each prompt,
/// with `adapter` if any, in `project`'s prefix-cache scope.
pub struct Submission<'a> {
    pub model: &'a ChatModel,
    pub request_id: &'a str,
    pub prompts: &'a [Vec<u32>],
    /// The request field the prompts came from (`messages`, `prompt`, `input`).
    pub prompt_param: &'a str,
    pub params: &'a SamplingParams,
    /// The field that set `params.max_tokens`, when the request set it.
    pub max_tokens_param: Option<&'a str>,
    pub n: usize,
    pub adapter: Option<&'a LoadedAdapter>,
    /// Who asks, in which project, with which priority.
    pub ctx: &'a RequestContext,
    /// The model as the request named it (usage and quotas are kept by it).
    pub model_name: &'a str,
    pub ledger: &'a Ledger,
    /// A grammar every choice follows (structured output).
    pub constraint: Option<Arc<dyn Constraint>>,
}

/// Submits the sequences of `sub`. Choice `i` of a seeded request uses
/// seed `seed + i`, so choices differ but the whole request is
/// reproducible. A `max_tokens` the context cannot hold after the prompt
/// is refused first (400 shape B naming the field).
pub fn submit(sub: Submission<'_>) -> Result<Vec<(ChoiceSlot, MeteredStream)>, HttpError> {
    let Submission {
        model,
        request_id,
        prompts,
        prompt_param,
        params,
        max_tokens_param,
        n,
        adapter,
        ctx,
        model_name,
        ledger,
        constraint,
    } = sub;
    crate::limits::check_room(
        model.engine.context_length(),
        prompts,
        prompt_param,
        params.max_tokens,
        max_tokens_param,
    )?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    // What the budget holds: every sequence's `max_tokens`, when set.
    let max_output = params
        .max_tokens
        .filter(|_| max_tokens_param.is_some())
        .map_or(0, |m| m.saturating_mul(prompts.len() * n));
    let ticket = ledger.admit(ctx, model_name, &model.entry, prompt_tokens, max_output)?;
    let scope: Arc<str> = ctx.project_id.as_str().into();
    let priority = ctx.priority;
    let mut streams = Vec::with_capacity(prompts.len() * n);
    for (p, ids) in prompts.iter().enumerate() {
        for c in 0..n {
            let index = p * n + c;
            let mut params = params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(index as u64));
            let request = GenerateRequest {
                id: format!("{request_id}-{index}"),
                prompt_ids: ids.clone(),
                params,
                priority,
                adapter: None,
                cache_scope: Some(scope.clone()),
                constraint: constraint.clone(),
            };
            let stream = match model.engine.submit_with(request, adapter.cloned()) {
                Ok(stream) => stream,
                Err(e) => {
                    ticket.cancel();
                    return Err(e.into());
                }
            };
            streams.push((ChoiceSlot { index, prompt: p }, stream));
        }
    }
    ticket.started();
    Ok(streams
        .into_iter()
        .map(|(slot, stream)| (slot, metered(stream, ticket.clone())))
        .collect())
}

/// A sequence's events, metered as they are read: output tokens are taken
/// from the quota as they come, the engine's final counts are recorded on
/// `Finished`, and a stream dropped before it finished (the client left,
/// the engine stopped) is charged what it produced.
pub struct MeteredStream {
    rx: TokenStream,
    ticket: Ticket,
    produced: usize,
    finished: bool,
}

fn metered(rx: TokenStream, ticket: Ticket) -> MeteredStream {
    MeteredStream {
        rx,
        ticket,
        produced: 0,
        finished: false,
    }
}

impl MeteredStream {
    pub async fn recv(&mut self) -> Option<TokenEvent> {
        let event = self.rx.recv().await?;
        self.meter(&event);
        Some(event)
    }

    /// Meters one event: a token as it comes, the end by its usage (once).
    fn meter(&mut self, event: &TokenEvent) {
        match event {
            TokenEvent::Token { .. } => {
                self.produced += 1;
                self.ticket.produced(1);
            }
            TokenEvent::Finished { usage, .. } if !self.finished => {
                let unseen = usage.completion_tokens.saturating_sub(self.produced);
                self.ticket.produced(unseen as u64);
                self.ticket
                    .finished(usage.completion_tokens, usage.cached_tokens);
                self.finished = true;
            }
            _ => {}
        }
    }
}

impl Drop for MeteredStream {
    /// A stream dropped early (its client left) is metered for every token
    /// the engine sent it, those still waiting in the channel included; a
    /// token computed after the channel closed reached no one and is not.
    fn drop(&mut self) {
        while !self.finished {
            match self.rx.try_recv() {
                Ok(event) => self.meter(&event),
                Err(_) => {
                    self.ticket.finished(self.produced, 0);
                    return;
                }
            }
        }
    }
}

/// All choices' events as one stream, each tagged with its choice.
pub fn merge(
    streams: Vec<(ChoiceSlot, MeteredStream)>,
) -> SelectAll<BoxStream<'static, (ChoiceSlot, TokenEvent)>> {
    stream::select_all(streams.into_iter().map(|(slot, rx)| {
        stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
        )
        .map(move |ev| (slot, ev))
        .boxed()
    }))
}

/// A finished choice.
#[derive(Debug, Clone)]
pub struct ChoiceOutput {
    pub slot: ChoiceSlot,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

/// Waits for every choice to finish; the first engine error fails the whole request.
pub async fn collect(
    streams: Vec<(ChoiceSlot, MeteredStream)>,
) -> Result<Vec<ChoiceOutput>, EngineError> {
    let mut outputs: Vec<ChoiceOutput> = streams
        .iter()
        .map(|(slot, _)| ChoiceOutput {
            slot: *slot,
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
        })
        .collect();
    let mut finished = 0;
    let total = outputs.len();
    let mut events = merge(streams);
    while let Some((slot, event)) = events.next().await {
        let out = outputs
            .iter_mut()
            .find(|o| o.slot.index == slot.index)
            .expect("every event belongs to a submitted choice");
        match event {
            TokenEvent::Token { id, text, logprobs } => {
                out.text.push_str(&text);
                out.token_ids.push(id);
                out.logprobs.extend(logprobs);
            }
            TokenEvent::Finished {
                reason,
                usage,
                text,
            } => {
                out.text.push_str(&text);
                out.finish_reason = reason;
                out.usage = usage;
                finished += 1;
            }
            TokenEvent::Error(e) => return Err(e),
        }
    }
    if finished < total {
        return Err(EngineError::Stopped);
    }
    outputs.sort_by_key(|o| o.slot.index);
    Ok(outputs)
}

/// Usage of a whole request, as its choices finish: each prompt counted
/// once, every choice's completion, and a prompt's cached tokens once (the
/// fewest any of its choices found: later choices of one prompt may find
/// the blocks the first one wrote).
#[derive(Debug, Default)]
pub struct UsageTally {
    completion_tokens: usize,
    cached: Vec<Option<usize>>,
}

impl UsageTally {
    pub fn add(&mut self, slot: ChoiceSlot, usage: &Usage) {
        self.completion_tokens += usage.completion_tokens;
        if self.cached.len() <= slot.prompt {
            self.cached.resize(slot.prompt + 1, None);
        }
        let cached = &mut self.cached[slot.prompt];
        *cached = Some(cached.map_or(usage.cached_tokens, |c| c.min(usage.cached_tokens)));
    }

    pub fn total(&self, prompts: &[Vec<u32>]) -> UsageInfo {
        let cached = prompts
            .iter()
            .zip(&self.cached)
            .map(|(prompt, cached)| cached.unwrap_or(0).min(prompt.len()))
            .sum();
        UsageInfo::new(
            prompts.iter().map(Vec::len).sum(),
            self.completion_tokens,
            cached,
        )
    }

    /// The tally of outputs already collected.
    pub fn of(outputs: &[ChoiceOutput]) -> Self {
        let mut tally = Self::default();
        for o in outputs {
            tally.add(o.slot, &o.usage);
        }
        tally
    }
}

/// A fresh response id with the given prefix.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{}", random_hex())
}

/// 128 random bits as 32 hex digits, the body of every generated id.
pub fn random_hex() -> String {
    hearth_store::ids::random_hex()
}

/// One piece of a choice's stream, handed to a route's renderer.
pub enum Piece {
    Token {
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        reason: FinishReason,
        text: String,
    },
}

/// Streams every choice's events as SSE chunks: `render` turns each piece
/// into the chunks to send (none, to skip it). An engine failure is sent as
/// the spec's error event. When every choice has finished, `usage_chunk`
/// (if given) is sent with the request's usage. `[DONE]` ends the stream
/// unless the client has gone.
pub async fn stream_choices<T: Serialize>(
    tx: &SseSender,
    streams: Vec<(ChoiceSlot, MeteredStream)>,
    prompts: &[Vec<u32>],
    mut render: impl FnMut(ChoiceSlot, Piece) -> Vec<T>,
    usage_chunk: Option<impl FnOnce(UsageInfo) -> T>,
) {
    let mut remaining = streams.len();
    let mut tally = UsageTally::default();
    let mut events = merge(streams);
    while let Some((slot, event)) = events.next().await {
        let piece = match event {
            TokenEvent::Token { text, logprobs, .. } => Piece::Token { text, logprobs },
            TokenEvent::Finished {
                reason,
                usage,
                text,
            } => {
                remaining -= 1;
                tally.add(slot, &usage);
                Piece::Finished { reason, text }
            }
            TokenEvent::Error(e) => {
                tx.error(&ApiError::from(e)).await;
                tx.done().await;
                return;
            }
        };
        for chunk in render(slot, piece) {
            if !tx.json(&chunk).await {
                return;
            }
        }
    }
    if remaining > 0 {
        tx.error(&ApiError::from(EngineError::Stopped)).await;
    } else if let Some(usage_chunk) = usage_chunk {
        let chunk = usage_chunk(tally.total(prompts));
        if !tx.json(&chunk).await {
            return;
        }
    }
    tx.done().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_core::{FinishReason, Usage};

    fn ticket(ledger: &Ledger) -> Ticket {
        let catalog = hearth_engine::catalog::Catalog::built_in();
        let entry = catalog.defaults().next().expect("a default model");
        let ctx = crate::batch_endpoints::batch_context("proj".into());
        ledger.admit(&ctx, "m", entry, 3, 0).unwrap()
    }

    fn output_tokens(ledger: &Ledger) -> i64 {
        ledger.totals().iter().map(|(_, c)| c.output_tokens).sum()
    }

    fn token(id: u32) -> TokenEvent {
        TokenEvent::Token {
            id,
            text: "x".into(),
            logprobs: None,
        }
    }

    #[tokio::test]
    async fn a_dropped_stream_is_metered_for_the_tokens_still_in_its_channel() {
        let ledger = Ledger::default();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut stream = metered(rx, ticket(&ledger));
        for id in 0..3 {
            tx.send(token(id)).unwrap();
        }
        // The client read one token, then left.
        assert!(matches!(
            stream.recv().await,
            Some(TokenEvent::Token { .. })
        ));
        drop(stream);
        assert_eq!(output_tokens(&ledger), 3);
    }

    #[tokio::test]
    async fn a_dropped_stream_whose_end_was_sent_is_metered_by_its_usage() {
        let ledger = Ledger::default();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = metered(rx, ticket(&ledger));
        tx.send(token(1)).unwrap();
        tx.send(TokenEvent::Finished {
            reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 0,
            },
            text: String::new(),
        })
        .unwrap();
        drop(stream);
        assert_eq!(output_tokens(&ledger), 2);
    }
}
