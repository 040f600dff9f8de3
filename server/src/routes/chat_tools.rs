//! Function calling in `POST /v1/chat/completions`: the tools' system
//! message, the answer turned into `tool_calls`, and the stream of a
//! request with tools (each choice sent whole once it has finished, since
//! whether it is calls or text is only known at its end).

use hearth_api::tools::{ToolCall, ValidTools};
use hearth_api::{ChatChunkChoice, ChatCompletionChunk, ChatResponseMessage};
use hearth_core::{ChatMessage, FinishReason};

use super::generate::{collect, random_hex, total_usage, ChoiceSlot, MeteredStream};
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

fn call_id() -> String {
    format!("call_{}", &random_hex()[..24])
}

/// The message of a finished choice: its calls (`finish_reason`
/// `tool_calls`) when it answered with calls, else its text.
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
        Some(calls) => (
            ChatResponseMessage::tool_calls(calls),
            FinishReason::ToolCalls,
        ),
        None => (ChatResponseMessage::assistant(text), reason),
    }
}

/// Streams a request with tools: each choice's role, then its text or its
/// calls, then its finish; then usage when asked; then `[DONE]`.
pub async fn stream_with_tools(
    tx: SseSender,
    streams: Vec<(ChoiceSlot, MeteredStream)>,
    tools: ValidTools,
    chunk: impl Fn(ChatChunkChoice) -> ChatCompletionChunk,
    usage: Option<impl FnOnce(hearth_api::UsageInfo) -> ChatCompletionChunk>,
    prompts: Vec<Vec<u32>>,
) {
    for (slot, _) in &streams {
        if !tx.json(&chunk(ChatChunkChoice::role(slot.index))).await {
            return;
        }
    }
    let outputs = match collect(streams).await {
        Ok(outputs) => outputs,
        Err(e) => {
            tx.error(&hearth_api::ApiError::from(e)).await;
            tx.done().await;
            return;
        }
    };
    let completion_tokens = outputs.iter().map(|o| o.usage.completion_tokens).sum();
    for o in outputs {
        let index = o.slot.index;
        let (message, reason) = answer(Some(&tools), o.text, o.finish_reason);
        let piece = match message.tool_calls {
            Some(calls) => ChatChunkChoice::tool_calls(index, &calls),
            None => ChatChunkChoice::content(index, message.content.unwrap_or_default(), None),
        };
        if !tx.json(&chunk(piece)).await
            || !tx
                .json(&chunk(ChatChunkChoice::finish(index, reason)))
                .await
        {
            return;
        }
    }
    if let Some(usage) = usage {
        let u = total_usage(&prompts, completion_tokens);
        if !tx
            .json(&usage(hearth_api::UsageInfo::new(
                u.prompt_tokens,
                u.completion_tokens,
            )))
            .await
        {
            return;
        }
    }
    tx.done().await;
}
