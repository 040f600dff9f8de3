//! The order of tool turns in a chat conversation, checked as OpenAI
//! checks it: an assistant message with `tool_calls` is followed by `tool`
//! messages answering each of its calls (before any other message), and
//! every `tool` message answers a call of that assistant message.

use serde_json::Value;

use crate::chat::ChatRequestMessage;
use crate::ApiError;

/// The calls of an assistant message still waiting for their answers.
struct Pending {
    /// The assistant message's index.
    index: usize,
    ids: Vec<String>,
    answered: Vec<bool>,
}

fn invalid(index: usize, message: String) -> ApiError {
    ApiError::bad_request(Some(&format!("messages[{index}]")), message)
}

/// The call ids of an assistant message's `tool_calls` (none when it has
/// none); a call without an `id` is 400.
fn call_ids(index: usize, calls: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let Some(Value::Array(calls)) = calls else {
        return Ok(Vec::new());
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| match call.get("id") {
            Some(Value::String(id)) if !id.is_empty() => Ok(id.clone()),
            _ => Err(ApiError::bad_request(
                Some(&format!("messages[{index}].tool_calls[{j}].id")),
                "Each of an assistant message's `tool_calls` needs its `id`.".to_string(),
            )),
        })
        .collect()
}

/// Checks that tool turns follow the calls they answer (400 naming the
/// message out of place).
pub(crate) fn check(messages: &[ChatRequestMessage]) -> Result<(), ApiError> {
    let mut pending: Option<Pending> = None;
    for (i, message) in messages.iter().enumerate() {
        if message.role == "tool" {
            let Some(p) = pending.as_mut() else {
                return Err(invalid(
                    i,
                    "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'.".to_string(),
                ));
            };
            let id = message.tool_call_id.as_deref().unwrap_or("");
            match p.ids.iter().position(|c| c == id) {
                Some(k) => p.answered[k] = true,
                None => {
                    return Err(invalid(
                        i,
                        format!("Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."),
                    ))
                }
            }
            continue;
        }
        if let Some(p) = pending.take() {
            unanswered(&p)?;
        }
        if message.role == "assistant" {
            let ids = call_ids(i, message.tool_calls.as_ref())?;
            if !ids.is_empty() {
                pending = Some(Pending {
                    index: i,
                    answered: vec![false; ids.len()],
                    ids,
                });
            }
        }
    }
    match pending {
        Some(p) => unanswered(&p),
        None => Ok(()),
    }
}

/// 400 naming the assistant message when some of its calls have no answer.
fn unanswered(p: &Pending) -> Result<(), ApiError> {
    let missing: Vec<&str> = p
        .ids
        .iter()
        .zip(&p.answered)
        .filter(|(_, done)| !**done)
        .map(|(id, _)| id.as_str())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(invalid(
        p.index,
        format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. \
             The following tool_call_ids did not have response messages: {}",
            missing.join(", ")
        ),
    ))
}
