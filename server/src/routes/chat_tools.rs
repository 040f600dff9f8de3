//! Function calling in `POST /v1/chat/completions`: the tools' system
//! message, the answer turned into `tool_calls`, and the stream of a
//! request with tools (text as it comes; calls whole once the choice has
//! finished).

use std::collections::HashMap;

use hearth_api::tools::{CallFormat, ToolCall, ValidTools};
use hearth_api::{ChatChunkChoice, ChatCompletionChunk, ChatResponseMessage};
use hearth_core::{ChatMessage, FinishReason};

use super::generate::{random_hex, stream_choices, ChoiceSlot, MeteredStream, Piece};
use super::sse::SseSender;

/// `messages` with the tools described in the (first) system message.
pub fn with_tool_prompt(messages: &[ChatMessage], tools: &ValidTools) -> Vec<ChatMessage> {
    let prompt = tools.system_prompt();
    let mut out = messages.to_vec();
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{prompt}", first.content);
        }
        _ => out.insert(
            0,
            ChatMessage {
                role: "system".to_string(),
                content: prompt,
            },
        ),
    }
    out
}

pub(crate) fn call_id() -> String {
    format!("call_{}", &random_hex()[..24])
}

/// The message of a finished choice: its calls (`finish_reason`
/// `tool_calls`; for the deprecated `functions`, its one call as
/// `function_call`) when it answered with calls, else its text.
pub fn answer(
    tools: Option<&ValidTools>,
    text: String,
    reason: FinishReason,
) -> (ChatResponseMessage, FinishReason) {
    let calls: Option<Vec<ToolCall>> = match (tools, reason) {
        (Some(tools), FinishReason::Stop) => tools.calls_in(&text, call_id),
        _ => None,
    };
    match calls {
        Some(calls) if tools.is_some_and(|t| t.legacy) => (
            ChatResponseMessage::function_call(calls.into_iter().next().map(|c| c.function)),
            FinishReason::FunctionCall,
        ),
        Some(calls) => (
            ChatResponseMessage::tool_calls(calls),
            FinishReason::ToolCalls,
        ),
        None => (ChatResponseMessage::assistant(text), reason),
    }
}

/// What an answer is, when tools were offered: the grammar lets a call
/// list, and only a call list, start with `[`, so its first character
/// decides. Text streams from there on; a call list is held to its end.
#[derive(Debug)]
pub struct AnswerShape {
    /// The answer's start while undecided, or the whole call list.
    held: String,
    text: bool,
    /// The character calls start with.
    opener: char,
}

/// What to do with a piece of the answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// Nothing to send yet.
    Hold,
    /// Send this text; `first` when it is the answer's first text.
    Text { first: bool, text: String },
}

impl AnswerShape {
    /// An answer already known to be text (no tools).
    pub fn text() -> Self {
        Self {
            held: String::new(),
            text: true,
            opener: '[',
        }
    }

    /// An answer that may be calls in `format`.
    pub fn calls_in(format: CallFormat) -> Self {
        Self {
            held: String::new(),
            text: false,
            opener: format.opener(),
        }
    }

    pub fn feed(&mut self, piece: &str) -> Fed {
        if self.text {
            return Fed::Text {
                first: false,
                text: piece.to_string(),
            };
        }
        self.held.push_str(piece);
        if self.held.is_empty() || self.held.starts_with(self.opener) {
            return Fed::Hold;
        }
        self.text = true;
        Fed::Text {
            first: true,
            text: std::mem::take(&mut self.held),
        }
    }

    /// Whether the answer is text, known before its end.
    pub fn is_text(&self) -> bool {
        self.text
    }

    /// What was held (a call list, or an undecided start).
    pub fn held(&self) -> &str {
        &self.held
    }
}

/// Streams a request with tools: each choice's role (without content);
/// then text as it comes
/// when the answer is text, or its calls once it ends; then its finish;
/// then usage when asked; then `[DONE]`.
pub async fn stream_with_tools(
    tx: SseSender,
    streams: Vec<(ChoiceSlot, MeteredStream)>,
    tools: ValidTools,
    chunk: impl Fn(ChatChunkChoice) -> ChatCompletionChunk,
    usage: Option<impl FnOnce(hearth_api::UsageInfo) -> ChatCompletionChunk>,
    prompts: Vec<Vec<u32>>,
) {
    for (slot, _) in &streams {
        if !tx
            .json(&chunk(ChatChunkChoice::role_only(slot.index)))
            .await
        {
            return;
        }
    }
    let mut shapes: HashMap<usize, AnswerShape> = HashMap::new();
    let render = |slot: ChoiceSlot, piece: Piece| {
        let shape = shapes
            .entry(slot.index)
            .or_insert_with(|| AnswerShape::calls_in(tools.format));
        let (text, end) = match piece {
            Piece::Token { text, .. } => (text, None),
            Piece::Finished { reason, text } => (text, Some(reason)),
        };
        let mut out = Vec::new();
        if let Fed::Text { text, .. } = shape.feed(&text) {
            if !text.is_empty() {
                out.push(chunk(ChatChunkChoice::content(slot.index, text, None)));
            }
        }
        let Some(reason) = end else {
            return out;
        };
        let reason = if shape.is_text() {
            reason
        } else {
            let (message, reason) = answer(Some(&tools), shape.held().to_string(), reason);
            out.push(chunk(match (message.tool_calls, message.function_call) {
                (Some(calls), _) => ChatChunkChoice::tool_calls(slot.index, &calls),
                (None, Some(call)) => ChatChunkChoice::function_call(slot.index, &call),
                (None, None) => {
                    ChatChunkChoice::content(slot.index, message.content.unwrap_or_default(), None)
                }
            }));
            reason
        };
        out.push(chunk(ChatChunkChoice::finish(slot.index, reason)));
        out
    };
    stream_choices(&tx, streams, &prompts, render, usage).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_character_decides_the_shape() {
        let mut calls = AnswerShape::calls_in(CallFormat::JsonArray);
        assert_eq!(calls.feed(""), Fed::Hold);
        assert_eq!(calls.feed("[{\"name\""), Fed::Hold);
        assert_eq!(calls.feed(": 1}]"), Fed::Hold);
        assert!(!calls.is_text());
        assert_eq!(calls.held(), "[{\"name\": 1}]");
        let mut text = AnswerShape::calls_in(CallFormat::Tagged);
        assert_eq!(
            text.feed("Hi"),
            Fed::Text {
                first: true,
                text: "Hi".into()
            }
        );
        assert_eq!(
            text.feed(" there"),
            Fed::Text {
                first: false,
                text: " there".into()
            }
        );
        assert!(text.is_text() && text.held().is_empty());
        let mut tagged = AnswerShape::calls_in(CallFormat::Tagged);
        assert_eq!(tagged.feed("<tool_call>"), Fed::Hold);
        assert!(!tagged.is_text());
    }
}
