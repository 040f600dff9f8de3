//! `POST /v1/responses` with `stream: true`: the typed events, each with
//! the next `sequence_number`: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`), then `data: [DONE]`. A
//! failure after the start is the spec's `error` event, then `[DONE]`, and
//! a stored response keeps it as `status: "failed"` with its `error`. A
//! departed client stops the producer, which drops the engine stream and
//! so frees the sequence at once.
//!
//! With `include` `message.output_text.logprobs`, each text delta carries
//! the log-probabilities of the tokens that gave it (a token whose text is
//! still held back passes its own on to the next delta, and any left at
//! the end go out in a last delta with empty text), so the deltas' lists
//! joined are the part's.
//!
//! With tools, the first character of the answer says what it is (the
//! grammar lets a call list, and only a call list, start with `[`): text
//! streams as above from there; calls are held to the end, then each is
//! sent as a `function_call` item: `response.output_item.added`,
//! `response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`, `response.output_item.done`.

use super::generate::MeteredStream;
use hearth_api::chat::ChatTokenLogprob;
use hearth_api::responses::{
    EventSequence, OutputItem, OutputMessage, OutputText, ResponseObject, ResponseUsage,
};
use hearth_api::tools::ValidTools;
use hearth_api::ApiError;
use hearth_core::{EngineError, FinishReason, TokenEvent};
use serde_json::Value;

use super::chat_tools::{AnswerShape, Fed};
use super::responses::{function_calls, Record};
use super::sse::SseSender;

/// The events of one response, in order.
struct Events<'a> {
    tx: &'a SseSender,
    seq: EventSequence,
    message_id: String,
    /// Text parts carry log-probabilities.
    logprobs: bool,
}

impl Events<'_> {
    /// Sends `events`; false once the client has gone.
    async fn send(&self, events: &[Value]) -> bool {
        for event in events {
            if !self.tx.json(event).await {
                return false;
            }
        }
        true
    }

    /// The message's opening events.
    async fn open_message(&mut self) -> bool {
        let events = [
            self.seq.item(
                "response.output_item.added",
                0,
                &OutputItem::Message(OutputMessage::assistant(
                    &self.message_id,
                    "in_progress",
                    None,
                )),
            ),
            self.seq.part(
                "response.content_part.added",
                &self.message_id,
                &OutputText::new(String::new(), self.logprobs.then(Vec::new)),
            ),
        ];
        self.send(&events).await
    }

    /// A text delta with the log-probabilities not sent yet (which it
    /// empties); nothing when both are empty.
    async fn delta(&mut self, text: &str, logprobs: &mut Vec<ChatTokenLogprob>) -> bool {
        if text.is_empty() && logprobs.is_empty() {
            return true;
        }
        let event = self.seq.delta(&self.message_id, text, logprobs);
        logprobs.clear();
        self.send(&[event]).await
    }

    /// The message's closing events.
    async fn close_message(&mut self, part: &OutputText, status: &str) -> bool {
        let id = self.message_id.clone();
        let events = [
            self.seq.text_done(&id, part),
            self.seq.part("response.content_part.done", &id, part),
            self.seq.item(
                "response.output_item.done",
                0,
                &OutputItem::Message(OutputMessage::assistant(&id, status, Some(part.clone()))),
            ),
        ];
        self.send(&events).await
    }

    /// The events of the call at `index` of `output`.
    async fn call(&mut self, index: usize, call: &hearth_api::responses::FunctionToolCall) -> bool {
        let mut opening = call.clone();
        opening.arguments = String::new();
        opening.status = "in_progress".to_string();
        let events = [
            self.seq.item(
                "response.output_item.added",
                index,
                &OutputItem::FunctionCall(opening),
            ),
            self.seq.arguments_delta(index, call, &call.arguments),
            self.seq.arguments_done(index, call),
            self.seq.item(
                "response.output_item.done",
                index,
                &OutputItem::FunctionCall(call.clone()),
            ),
        ];
        self.send(&events).await
    }

    /// The spec's in-stream failure, then `[DONE]`.
    async fn fail(&mut self, error: ApiError) {
        let event = self.seq.error(&error);
        if self.send(&[event]).await {
            self.tx.done().await;
        }
    }
}

/// What the streamed answer is made of besides the engine's events.
pub struct Answer {
    /// The id of the output message, if it is text.
    pub message_id: String,
    pub prompt_tokens: usize,
    /// The functions the model may call instead of answering in text.
    pub tools: Option<ValidTools>,
    /// Text parts and deltas carry log-probabilities.
    pub logprobs: bool,
}

/// How the answer's events ended.
enum Ended {
    /// Every event went out; the object holds the finished response.
    Done,
    /// The engine failed (or stopped) after the response started.
    Failed(ApiError),
    /// The client left.
    Gone,
}

/// Streams the response, then stores it: finished, or `failed` with its
/// error when the engine failed after the start (as OpenAI keeps a failed
/// response); a response whose client left is not stored.
pub async fn stream_response(
    tx: SseSender,
    stream: MeteredStream,
    mut object: ResponseObject,
    answer: Answer,
    record: Record,
) {
    let mut events = Events {
        tx: &tx,
        seq: EventSequence::default(),
        message_id: answer.message_id.clone(),
        logprobs: answer.logprobs,
    };
    let failure = match produce(&mut events, stream, &mut object, answer).await {
        Ended::Gone => return,
        Ended::Failed(error) => {
            object.fail(&error);
            Some(error)
        }
        Ended::Done => None,
    };
    if let Err(e) = record.keep(&object).await {
        tracing::warn!(response = %object.id, "cannot store a response: {}", e.0.message());
        return events.fail(failure.unwrap_or(e.0)).await;
    }
    if let Some(error) = failure {
        return events.fail(error).await;
    }
    let last = if object.status == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    let event = events.seq.response(last, &object);
    if events.send(&[event]).await {
        tx.done().await;
    }
}

/// Sends the answer's events and finishes `object` with it.
async fn produce(
    events: &mut Events<'_>,
    mut stream: MeteredStream,
    object: &mut ResponseObject,
    answer: Answer,
) -> Ended {
    let Answer {
        prompt_tokens,
        tools,
        logprobs,
        ..
    } = answer;
    let opening = [
        events.seq.response("response.created", object),
        events.seq.response("response.in_progress", object),
    ];
    if !events.send(&opening).await {
        return Ended::Gone;
    }
    let mut shape = match &tools {
        Some(tools) => AnswerShape::calls_in(tools.format),
        None => AnswerShape::text(),
    };
    if shape.is_text() && !events.open_message().await {
        return Ended::Gone;
    }
    let mut text = String::new();
    // Every token's log-probabilities, and those no delta has carried yet.
    let (mut all, mut pending) = (Vec::new(), Vec::new());
    let (reason, usage) = loop {
        let Some(event) = stream.recv().await else {
            return Ended::Failed(EngineError::Stopped.into());
        };
        let (piece, end) = match event {
            TokenEvent::Token {
                text: piece,
                logprobs: token_logprobs,
                ..
            } => {
                if let Some(lp) = token_logprobs.filter(|_| logprobs) {
                    all.push(ChatTokenLogprob::from(&lp));
                    pending.push(ChatTokenLogprob::from(&lp));
                }
                (piece, None)
            }
            TokenEvent::Finished {
                reason,
                usage,
                text: rest,
            } => (rest, Some((reason, usage))),
            TokenEvent::Error(e) => return Ended::Failed(e.into()),
        };
        text.push_str(&piece);
        if let Fed::Text { first, text } = shape.feed(&piece) {
            if first && !events.open_message().await {
                return Ended::Gone;
            }
            if !text.is_empty() && !events.delta(&text, &mut pending).await {
                return Ended::Gone;
            }
        }
        if let Some(end) = end {
            break end;
        }
    };
    let usage = ResponseUsage::new(prompt_tokens, usage.completion_tokens, usage.cached_tokens);
    let calls = match shape.is_text() {
        true => None,
        false => function_calls(tools.as_ref(), &text, reason),
    };
    let cut = reason == FinishReason::Length;
    let status = if cut { "incomplete" } else { "completed" };
    match calls {
        Some(calls) => {
            for (index, call) in calls.iter().enumerate() {
                if !events.call(index, call).await {
                    return Ended::Gone;
                }
            }
            object.finish_calls(calls, usage);
        }
        None => {
            // A held answer that is not a call list after all (cut by
            // `max_output_tokens`) goes out as text.
            if !shape.is_text() && !events.open_message().await {
                return Ended::Gone;
            }
            let rest = if shape.is_text() { "" } else { text.as_str() };
            if !events.delta(rest, &mut pending).await {
                return Ended::Gone;
            }
            let part = OutputText::new(text, logprobs.then_some(all));
            if !events.close_message(&part, status).await {
                return Ended::Gone;
            }
            object.finish(events.message_id.clone(), part, cut, usage);
        }
    }
    Ended::Done
}
