//! `POST /v1/responses` with `stream: true`: the typed events, each with
//! the next `sequence_number`: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`), then `data: [DONE]`. A
//! failure after the start is the spec's `error` event, then `[DONE]`. A
//! departed client stops the producer, which drops the engine stream and
//! so frees the sequence at once.
//!
//! With tools, the first character of the answer says what it is (the
//! grammar lets a call list, and only a call list, start with `[`): text
//! streams as above from there; calls are held to the end, then each is
//! sent as a `function_call` item: `response.output_item.added`,
//! `response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`, `response.output_item.done`.

use super::generate::MeteredStream;
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
                &OutputText::new(String::new()),
            ),
        ];
        self.send(&events).await
    }

    async fn delta(&mut self, text: &str) -> bool {
        if text.is_empty() {
            return true;
        }
        let event = self.seq.delta(&self.message_id, text);
        self.send(&[event]).await
    }

    /// The message's closing events.
    async fn close_message(&mut self, text: &str, status: &str) -> bool {
        let id = self.message_id.clone();
        let events = [
            self.seq.text_done(&id, text),
            self.seq.part(
                "response.content_part.done",
                &id,
                &OutputText::new(text.to_string()),
            ),
            self.seq.item(
                "response.output_item.done",
                0,
                &OutputItem::Message(OutputMessage::assistant(
                    &id,
                    status,
                    Some(text.to_string()),
                )),
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

pub async fn stream_response(
    tx: SseSender,
    mut stream: MeteredStream,
    mut object: ResponseObject,
    message_id: String,
    prompt_tokens: usize,
    record: Record,
    tools: Option<ValidTools>,
) {
    let mut events = Events {
        tx: &tx,
        seq: EventSequence::default(),
        message_id,
    };
    let opening = [
        events.seq.response("response.created", &object),
        events.seq.response("response.in_progress", &object),
    ];
    if !events.send(&opening).await {
        return;
    }
    let mut shape = match &tools {
        Some(tools) => AnswerShape::calls_in(tools.format),
        None => AnswerShape::text(),
    };
    if shape.is_text() && !events.open_message().await {
        return;
    }
    let mut text = String::new();
    let (reason, usage) = loop {
        let Some(event) = stream.recv().await else {
            return events.fail(EngineError::Stopped.into()).await;
        };
        let (piece, end) = match event {
            TokenEvent::Token { text: piece, .. } => (piece, None),
            TokenEvent::Finished {
                reason,
                usage,
                text: rest,
            } => (rest, Some((reason, usage))),
            TokenEvent::Error(e) => return events.fail(e.into()).await,
        };
        text.push_str(&piece);
        if let Fed::Text { first, text } = shape.feed(&piece) {
            if first && !events.open_message().await {
                return;
            }
            if !events.delta(&text).await {
                return;
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
                    return;
                }
            }
            object.finish_calls(calls, usage);
        }
        None => {
            // A held answer that is not a call list after all (cut by
            // `max_output_tokens`) goes out as text.
            if !shape.is_text() && (!events.open_message().await || !events.delta(&text).await) {
                return;
            }
            if !events.close_message(&text, status).await {
                return;
            }
            object.finish(events.message_id.clone(), text, cut, usage);
        }
    }
    if let Err(e) = record.keep(&object).await {
        tracing::warn!(response = %object.id, "cannot store a response: {}", e.0.message());
        return events.fail(e.0).await;
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
