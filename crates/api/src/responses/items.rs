//! The turns of a Responses conversation: messages, the model's function
//! calls and their results. They are read from `input`, stored with the
//! response (so `previous_response_id` continues them), listed by
//! `input_items`, and shown to the chat template as messages.

use hearth_core::ChatMessage;
use serde_json::{json, Value};

use super::{InputItem, ItemContent};
use crate::error::ApiError;
use crate::tools::{calls_text, native_message, tool_result_text};

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum ConversationItem {
    /// `user`, `assistant`, `system` or `developer` text.
    Message { role: String, text: String },
    /// A call the model made (`function_call`).
    FunctionCall(CallTurn),
    /// A call's result (`function_call_output`).
    FunctionOutput { call_id: String, output: String },
}

/// A function call: `call_id` pairs it with its result; `arguments` is a
/// JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct CallTurn {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), message)
}

impl ConversationItem {
    /// A text message.
    pub fn message(role: &str, text: impl Into<String>) -> Self {
        Self::Message {
            role: role.to_string(),
            text: text.into(),
        }
    }

    /// Item `i` of `input`.
    pub(super) fn from_input(i: usize, item: &InputItem) -> Result<Self, ApiError> {
        let field = |name: &str| format!("input[{i}].{name}");
        let text_field = |name: &str, value: &Option<String>| {
            value
                .clone()
                .ok_or_else(|| invalid(&field(name), format!("This item needs `{name}`.")))
        };
        match item.kind.as_deref() {
            None | Some("message") => message(i, item),
            Some("function_call") => {
                let arguments = text_field("arguments", &item.arguments)?;
                if serde_json::from_str::<Value>(&arguments).is_err() {
                    return Err(invalid(
                        &field("arguments"),
                        "`arguments` must be a JSON text.",
                    ));
                }
                Ok(Self::FunctionCall(CallTurn {
                    call_id: text_field("call_id", &item.call_id)?,
                    name: text_field("name", &item.name)?,
                    arguments,
                }))
            }
            Some("function_call_output") => Ok(Self::FunctionOutput {
                call_id: text_field("call_id", &item.call_id)?,
                output: output_text(i, item.output.as_ref())?,
            }),
            Some(kind) => Err(invalid(
                &field("type"),
                format!(
                    "Input items of type `{kind}` are not supported; only `message`, \
                     `function_call` and `function_call_output` are."
                ),
            )),
        }
    }

    /// The turn as the chat template sees it (see [`chat_messages`]).
    fn chat(&self) -> ChatMessage {
        let (role, content) = match self {
            Self::Message { role, text } if role == "developer" => ("system", text.clone()),
            Self::Message { role, text } => (role.as_str(), text.clone()),
            Self::FunctionCall(call) => ("assistant", call_list(&[call])),
            Self::FunctionOutput { call_id, output } => ("user", tool_result_text(call_id, output)),
        };
        ChatMessage {
            role: role.to_string(),
            content,
        }
    }

    /// How the turn is kept with a stored response.
    pub fn to_stored(&self) -> Value {
        match self {
            Self::Message { role, text } => json!({"role": role, "content": text}),
            Self::FunctionCall(c) => json!({"type": "function_call", "call_id": c.call_id,
                "name": c.name, "arguments": c.arguments}),
            Self::FunctionOutput { call_id, output } => {
                json!({"type": "function_call_output", "call_id": call_id, "output": output})
            }
        }
    }

    /// A kept turn, read back.
    pub fn from_stored(value: &Value) -> Self {
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        match value["type"].as_str() {
            Some("function_call") => Self::FunctionCall(CallTurn {
                call_id: text("call_id"),
                name: text("name"),
                arguments: text("arguments"),
            }),
            Some("function_call_output") => Self::FunctionOutput {
                call_id: text("call_id"),
                output: text("output"),
            },
            _ => Self::Message {
                role: value["role"].as_str().unwrap_or("user").to_string(),
                text: text("content"),
            },
        }
    }
}

/// The calls in the format the model is told to call with.
fn call_list(calls: &[&CallTurn]) -> String {
    let pairs: Vec<(Value, Value)> = calls
        .iter()
        .map(|c| (json!(c.name), json!(c.arguments)))
        .collect();
    calls_text(pairs.iter().map(|(n, a)| (n, a)))
}

/// The conversation in turns: each run of calls made one after another
/// (one assistant answer), or one other item.
fn turns(items: &[ConversationItem]) -> impl Iterator<Item = &[ConversationItem]> {
    let is_call = |item: &ConversationItem| matches!(item, ConversationItem::FunctionCall(_));
    items.chunk_by(move |a, b| is_call(a) && is_call(b))
}

/// The calls of a turn from [`turns`] (none when it is another item).
fn calls_of(turn: &[ConversationItem]) -> Vec<&CallTurn> {
    turn.iter()
        .filter_map(|item| match item {
            ConversationItem::FunctionCall(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The conversation as chat messages; calls made one after another are one
/// assistant message, as the model would have answered them.
pub fn chat_messages(items: &[ConversationItem]) -> Vec<ChatMessage> {
    turns(items)
        .map(|turn| match calls_of(turn).as_slice() {
            [] => turn[0].chat(),
            calls => ChatMessage {
                role: "assistant".to_string(),
                content: call_list(calls),
            },
        })
        .collect()
}

/// The conversation as chat templates that know tools take it: calls as
/// an assistant message's `tool_calls` (those made one after another
/// together), results as `tool` messages.
pub fn native_messages(items: &[ConversationItem]) -> Vec<Value> {
    turns(items)
        .map(|turn| match (calls_of(turn).as_slice(), &turn[0]) {
            ([], ConversationItem::FunctionOutput { call_id, output }) => {
                native_message("tool", true, output, None, Some(call_id))
            }
            ([], message) => {
                let chat = message.chat();
                native_message(&chat.role, false, &chat.content, None, None)
            }
            (calls, _) => {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.call_id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                native_message("assistant", false, "", Some(&Value::Array(calls)), None)
            }
        })
        .collect()
}

/// Every `function_call_output` of `input` must answer a call made before
/// it, in `earlier` (the previous response's conversation) or in `input`;
/// and every call must have its output before the next message (or the
/// end of `input`), including calls the previous response ended with.
pub fn check_outputs(
    earlier: &[ConversationItem],
    input: &[ConversationItem],
) -> Result<(), ApiError> {
    let mut calls: Vec<&str> = Vec::new();
    // Calls still waiting for their output.
    let mut open: Vec<&str> = Vec::new();
    // Calls that have their output.
    let mut answered: Vec<&str> = Vec::new();
    for item in earlier {
        match item {
            ConversationItem::FunctionCall(c) => {
                calls.push(&c.call_id);
                open.push(&c.call_id);
            }
            ConversationItem::FunctionOutput { call_id, .. } => {
                open.retain(|c| c != call_id);
                answered.push(call_id);
            }
            ConversationItem::Message { .. } => open.clear(),
        }
    }
    let unanswered = |call_id: &str| {
        invalid(
            "input",
            format!("No tool output found for function call {call_id}."),
        )
    };
    for (i, item) in input.iter().enumerate() {
        match item {
            ConversationItem::FunctionCall(c) => {
                calls.push(&c.call_id);
                open.push(&c.call_id);
            }
            ConversationItem::FunctionOutput { call_id, .. } if !calls.contains(&call_id.as_str()) => {
                return Err(invalid(
                    &format!("input[{i}].call_id"),
                    format!("No function call with call_id `{call_id}` comes before this output: give the `function_call` item in `input`, or continue the response that made it with `previous_response_id`."),
                ))
            }
            ConversationItem::FunctionOutput { call_id, .. } if answered.contains(&call_id.as_str()) => {
                return Err(invalid(
                    &format!("input[{i}].call_id"),
                    format!("The function call `{call_id}` already has its output; give one `function_call_output` per call."),
                ))
            }
            ConversationItem::FunctionOutput { call_id, .. } => {
                open.retain(|c| c != call_id);
                answered.push(call_id);
            }
            ConversationItem::Message { .. } => {
                if let Some(call_id) = open.first() {
                    return Err(unanswered(call_id));
                }
            }
        }
    }
    match open.first() {
        Some(call_id) => Err(unanswered(call_id)),
        None => Ok(()),
    }
}

/// A message item.
fn message(i: usize, item: &InputItem) -> Result<ConversationItem, ApiError> {
    let role = match item.role.as_deref() {
        Some(role @ ("user" | "assistant" | "system" | "developer")) => role,
        Some(other) => {
            return Err(invalid(
                &format!("input[{i}].role"),
                format!(
                    "Role `{other}` is not supported; use `user`, `assistant`, `system` or `developer` (a tool's result is a `function_call_output` item)."
                ),
            ))
        }
        None => {
            return Err(invalid(
                &format!("input[{i}].role"),
                "Each input message needs a `role`.",
            ))
        }
    };
    let text = match &item.content {
        None => {
            return Err(invalid(
                &format!("input[{i}].content"),
                "Each input message needs `content`.",
            ))
        }
        Some(ItemContent::Text(text)) => text.clone(),
        Some(ItemContent::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let allowed = match role {
                    "assistant" => ["output_text", "input_text"].contains(&part.kind.as_str()),
                    _ => part.kind == "input_text",
                };
                if !allowed {
                    return Err(invalid(
                        &format!("input[{i}].content[{j}].type"),
                        format!(
                            "Content parts of type `{}` are not supported here; only text (`input_text`, and `output_text` in assistant messages) is.",
                            part.kind
                        ),
                    ));
                }
                match &part.text {
                    Some(text) => texts.push(text.as_str()),
                    None => {
                        return Err(invalid(
                            &format!("input[{i}].content[{j}].text"),
                            "A text part needs `text`.",
                        ))
                    }
                }
            }
            texts.join("\n")
        }
    };
    Ok(ConversationItem::message(role, text))
}

/// A `function_call_output`'s `output`: a string, or a list of
/// `input_text` parts.
fn output_text(i: usize, output: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("input[{i}].output");
    match output {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("input_text"), Some(text)) => texts.push(text),
                    _ => return Err(invalid(
                        &format!("{param}[{j}]"),
                        "Only `input_text` parts with `text` are supported in a function's output.",
                    )),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(invalid(
            &param,
            "`output` must be a string or a list of `input_text` parts.",
        )),
        None => Err(invalid(
            &param,
            "A `function_call_output` item needs `output`.",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ConversationItem {
        ConversationItem::FunctionCall(CallTurn {
            call_id: id.into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris"}"#.into(),
        })
    }

    #[test]
    fn calls_in_a_row_are_one_assistant_message() {
        let items = [
            ConversationItem::message("developer", "be brief"),
            call("a"),
            call("b"),
            ConversationItem::FunctionOutput {
                call_id: "a".into(),
                output: "sunny".into(),
            },
        ];
        let messages = chat_messages(&items);
        let roles: Vec<_> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "assistant", "user"]);
        assert_eq!(
            messages[1].content,
            r#"[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","arguments":{"city":"Paris"}}]"#
        );
        assert_eq!(messages[2].content, "Result of the tool call a:\nsunny");
        for item in &items {
            assert_eq!(&ConversationItem::from_stored(&item.to_stored()), item);
        }
        let native = native_messages(&items);
        assert_eq!(native.len(), 3);
        assert_eq!(native[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(native[1]["tool_calls"][1]["id"], "b");
        assert_eq!(
            native[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(
            native[2],
            json!({"role": "tool", "content": "sunny", "tool_call_id": "a"})
        );
    }

    #[test]
    fn an_output_must_follow_its_call() {
        let out = ConversationItem::FunctionOutput {
            call_id: "a".into(),
            output: "x".into(),
        };
        check_outputs(&[call("a")], std::slice::from_ref(&out)).unwrap();
        check_outputs(&[], &[call("a"), out.clone()]).unwrap();
        let answered = ConversationItem::FunctionOutput {
            call_id: "b".into(),
            output: "y".into(),
        };
        let e = check_outputs(
            &[call("b"), answered],
            &[ConversationItem::message("user", "hi"), out],
        )
        .unwrap_err();
        assert_eq!(e.param(), Some("input[1].call_id"));
    }

    #[test]
    fn a_call_needs_its_output_before_the_next_message() {
        let user = ConversationItem::message("user", "never mind");
        let out = |id: &str| ConversationItem::FunctionOutput {
            call_id: id.into(),
            output: "x".into(),
        };
        let refused = [
            // In the input: a message after the call, or the input's end.
            (vec![], vec![user.clone(), call("a"), user.clone()]),
            (vec![], vec![user.clone(), call("a")]),
            (vec![], vec![call("b"), call("a"), out("b"), user.clone()]),
            // The previous response ended with the call.
            (vec![user.clone(), call("a")], vec![user.clone()]),
        ];
        for (earlier, input) in refused {
            let e = check_outputs(&earlier, &input).unwrap_err();
            assert_eq!((e.status(), e.param()), (400, Some("input")), "{input:?}");
            assert!(
                e.message()
                    .contains("No tool output found for function call a."),
                "{}",
                e.message()
            );
        }
        check_outputs(&[user.clone(), call("a")], &[out("a"), user.clone()]).unwrap();
        check_outputs(&[call("a"), out("a")], std::slice::from_ref(&user)).unwrap();
        check_outputs(&[], &[call("a"), call("b"), out("b"), out("a"), user]).unwrap();
    }

    #[test]
    fn a_call_has_one_output() {
        let out = |id: &str| ConversationItem::FunctionOutput {
            call_id: id.into(),
            output: "x".into(),
        };
        for (earlier, input, at) in [
            (
                vec![],
                vec![call("a"), out("a"), out("a")],
                "input[2].call_id",
            ),
            (
                vec![call("a")],
                vec![out("a"), out("a")],
                "input[1].call_id",
            ),
            (
                vec![call("a"), out("a")],
                vec![out("a")],
                "input[0].call_id",
            ),
        ] {
            let e = check_outputs(&earlier, &input).unwrap_err();
            assert_eq!((e.status(), e.param()), (400, Some(at)), "{input:?}");
            assert!(
                e.message().contains("already has its output"),
                "{}",
                e.message()
            );
        }
    }
}
