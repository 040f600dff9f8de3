//! `POST /v1/responses` with `stream: true`: the typed events, each with
//! the next `sequence_number`: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`), then `data: [DONE]`. A
//! failure after the start is the spec's `error` event, then `[DONE]`. A
//! departed client stops the producer, which drops the engine stream and
//! so frees the sequence at once.

use super::generate::MeteredStream;
use hearth_api::responses::{
    EventSequence, OutputMessage, OutputText, ResponseObject, ResponseUsage,
};
use hearth_api::ApiError;
use hearth_core::{EngineError, FinishReason, TokenEvent};

use super::responses::Record;
use super::sse::SseSender;

pub async fn stream_response(
    tx: SseSender,
    mut stream: MeteredStream,
    mut object: ResponseObject,
    message_id: String,
    prompt_tokens: usize,
    record: Record,
) {
    let mut seq = EventSequence::default();
    let opening = [
        seq.response("response.created", &object),
        seq.response("response.in_progress", &object),
        seq.item(
            "response.output_item.added",
            &OutputMessage::assistant(&message_id, "in_progress", None),
        ),
        seq.part(
            "response.content_part.added",
            &message_id,
            &OutputText::new(String::new()),
        ),
    ];
    for event in &opening {
        if !tx.json(event).await {
            return;
        }
    }
    let mut text = String::new();
    let (reason, usage) = loop {
        let Some(event) = stream.recv().await else {
            return fail(&tx, &mut seq, EngineError::Stopped.into()).await;
        };
        match event {
            TokenEvent::Token { text: piece, .. } => {
                if !piece.is_empty() && !tx.json(&seq.delta(&message_id, &piece)).await {
                    return;
                }
                text.push_str(&piece);
            }
            TokenEvent::Finished {
                reason,
                usage,
                text: rest,
            } => {
                if !rest.is_empty() && !tx.json(&seq.delta(&message_id, &rest)).await {
                    return;
                }
                text.push_str(&rest);
                break (reason, usage);
            }
            TokenEvent::Error(e) => return fail(&tx, &mut seq, e.into()).await,
        }
    };
    let cut = reason == FinishReason::Length;
    let status = if cut { "incomplete" } else { "completed" };
    let closing = [
        seq.text_done(&message_id, &text),
        seq.part(
            "response.content_part.done",
            &message_id,
            &OutputText::new(text.clone()),
        ),
        seq.item(
            "response.output_item.done",
            &OutputMessage::assistant(&message_id, status, Some(text.clone())),
        ),
    ];
    for event in &closing {
        if !tx.json(event).await {
            return;
        }
    }
    object.finish(
        message_id,
        text,
        cut,
        ResponseUsage::new(prompt_tokens, usage.completion_tokens, usage.cached_tokens),
    );
    if let Err(e) = record.keep(&object).await {
        tracing::warn!(response = %object.id, "cannot store a response: {}", e.0.message());
        return fail(&tx, &mut seq, e.0).await;
    }
    let last = if cut {
        "response.incomplete"
    } else {
        "response.completed"
    };
    if tx.json(&seq.response(last, &object)).await {
        tx.done().await;
    }
}

/// The spec's in-stream failure, then `[DONE]`.
async fn fail(tx: &SseSender, seq: &mut EventSequence, error: ApiError) {
    if tx.json(&seq.error(&error)).await {
        tx.done().await;
    }
}
