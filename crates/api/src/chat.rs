//! Wire types of `POST /v1/chat/completions`: the request (messages with
//! string or text-part content), the response, the stream chunk and the
//! chat log-probability object.
//!
//! Validation into engine parameters lives in [`crate::validate`].

use std::collections::BTreeMap;

use hearth_core::{FinishReason, TokenCandidate, TokenLogprobs};
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::common::{
    string_or_seq, Completion, Stop, StreamOptions, StringOrSeq, UsageInfo, OBJECT_CHAT_CHUNK,
    OBJECT_CHAT_COMPLETION, SERVICE_TIER,
};

/// Body of `POST /v1/chat/completions`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatRequestMessage>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`, which wins.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// 0 to 20; needs `logprobs: true` when above 0.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Functions the model may call: `[{"type": "function", "function":
    /// {name, description, parameters}}]`.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `none`, `auto` (default), `required`, or `{"type": "function",
    /// "function": {"name": ...}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether one answer may call several tools (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's deprecated form of `tools`: `[{name, description,
    /// parameters}]`, answered with one `message.function_call`.
    #[serde(default)]
    pub functions: Option<Value>,
    /// OpenAI's deprecated form of `tool_choice`: `none`, `auto` or
    /// `{"name": ...}`.
    #[serde(default)]
    pub function_call: Option<Value>,
    /// Extension (as vLLM): the output is JSON of this schema.
    #[serde(default)]
    pub guided_json: Option<Value>,
    /// Extension: the output matches this regular expression.
    #[serde(default)]
    pub guided_regex: Option<String>,
    /// Extension: the output is exactly one of these strings.
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
    /// Extension: the output follows this Lark grammar.
    #[serde(default)]
    pub guided_grammar: Option<String>,
    /// Extension: keep the k most likely tokens; -1 or 0 disables it.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Extension: min-p sampling, 0 to 1.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Extension: CTRL-style repetition penalty, > 0 (1 disables it).
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// Extension: keep generating past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// OpenAI's audio output: refused (the served models write text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Value>,
    /// `["text"]` only; `audio` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Value>,
    /// OpenAI's hosted web search: refused (Hearth runs no hosted tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_options: Option<Value>,
    /// Refused: the served models have no reasoning settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<Value>,
    /// `medium` only (what every served model does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<Value>,
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatRequestMessage {
    /// `system`, `developer` (treated as `system`), `user` or `assistant`.
    #[schema(schema_with = crate::schemas::chat_role)]
    pub role: String,
    /// Null is allowed for `assistant` only.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's earlier calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's earlier call of the deprecated `functions`:
    /// `{name, arguments}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<Value>,
}

/// `content`: a string or an array of content parts.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part; only `type: "text"` is supported (checked in validation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(
            match string_or_seq(deserializer, "a string or an array of content parts")? {
                StringOrSeq::One(text) => MessageContent::Text(text),
                StringOrSeq::Many(parts) => MessageContent::Parts(parts),
            },
        )
    }
}

/// Response of a non-streamed chat completion: `id` is `chatcmpl-...`,
/// `object` always `chat.completion`.
pub type ChatCompletionResponse = Completion<ChatChoice, UsageInfo>;

impl ChatCompletionResponse {
    pub fn new(
        id: String,
        created: u64,
        model: String,
        choices: Vec<ChatChoice>,
        usage: UsageInfo,
    ) -> Self {
        Self::build(OBJECT_CHAT_COMPLETION, id, created, model, choices, usage)
    }
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    #[schema(value_type = Option<crate::schemas::FinishReason>)]
    pub finish_reason: Option<FinishReason>,
}

/// The generated message: `role` is always `assistant`; `content` is null
/// when the model called tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChatResponseMessage {
    pub role: String,
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::tools::ToolCall>>,
    /// The call, when the request gave the deprecated `functions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<crate::tools::FunctionCall>,
}

impl ChatResponseMessage {
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".to_string(),
            content: Some(content.into()),
            tool_calls: None,
            function_call: None,
        }
    }

    pub fn tool_calls(calls: Vec<crate::tools::ToolCall>) -> Self {
        Self {
            tool_calls: Some(calls),
            ..Self::function_call(None)
        }
    }

    /// A call of the deprecated `functions` (none: no content either).
    pub fn function_call(call: Option<crate::tools::FunctionCall>) -> Self {
        Self {
            role: "assistant".to_string(),
            content: None,
            tool_calls: None,
            function_call: call,
        }
    }
}

/// `logprobs` of a chat choice or chunk choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

impl ChatLogprobs {
    pub fn from_tokens(tokens: &[TokenLogprobs]) -> Self {
        Self {
            content: tokens.iter().map(ChatTokenLogprob::from).collect(),
        }
    }
}

/// Log-probability of one generated token, with its top alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative of a [`ChatTokenLogprob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
}

impl From<&TokenCandidate> for ChatTopLogprob {
    fn from(c: &TokenCandidate) -> Self {
        Self {
            token: c.text.clone(),
            logprob: c.logprob,
            bytes: Some(c.bytes.clone()),
        }
    }
}

impl From<&TokenLogprobs> for ChatTokenLogprob {
    fn from(lp: &TokenLogprobs) -> Self {
        Self {
            token: lp.chosen.text.clone(),
            logprob: lp.chosen.logprob,
            bytes: Some(lp.chosen.bytes.clone()),
            top_logprobs: lp.top.iter().map(ChatTopLogprob::from).collect(),
        }
    }
}

/// A stream chunk of a chat completion (`chat.completion.chunk`). The first
/// chunk of each choice has `delta = {"role": "assistant", "content": ""}`
/// (without `content` when tools were offered: a choice of calls carries
/// none);
/// `usage` is null except in the final usage chunk, whose `choices` is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub service_tier: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChunkChoice>,
    pub usage: Option<UsageInfo>,
}

impl ChatCompletionChunk {
    /// A chunk carrying choice increments.
    pub fn new(id: String, created: u64, model: String, choices: Vec<ChatChunkChoice>) -> Self {
        Self {
            id,
            object: OBJECT_CHAT_CHUNK.to_string(),
            created,
            model,
            service_tier: SERVICE_TIER.to_string(),
            system_fingerprint: None,
            choices,
            usage: None,
        }
    }

    /// The final usage chunk: no choices, `usage` set.
    pub fn usage(id: String, created: u64, model: String, usage: UsageInfo) -> Self {
        Self {
            usage: Some(usage),
            ..Self::new(id, created, model, Vec::new())
        }
    }
}

/// One choice's increment in a chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    #[schema(value_type = Option<crate::schemas::FinishReason>)]
    pub finish_reason: Option<FinishReason>,
}

impl ChatChunkChoice {
    /// The first increment of a choice: role `assistant`, empty content.
    pub fn role(index: usize) -> Self {
        Self {
            index,
            delta: ChatDelta {
                role: Some("assistant".to_string()),
                content: Some(String::new()),
                tool_calls: None,
                function_call: None,
            },
            logprobs: None,
            finish_reason: None,
        }
    }

    /// The first increment of a choice that may be tool calls: role
    /// `assistant`, no content (a choice of calls has none).
    pub fn role_only(index: usize) -> Self {
        let mut choice = Self::role(index);
        choice.delta.content = None;
        choice
    }

    /// A text increment, with the log-probabilities of its tokens if asked for.
    pub fn content(index: usize, text: impl Into<String>, logprobs: Option<ChatLogprobs>) -> Self {
        Self {
            index,
            delta: ChatDelta {
                role: None,
                content: Some(text.into()),
                tool_calls: None,
                function_call: None,
            },
            logprobs,
            finish_reason: None,
        }
    }

    /// The calls of a choice, each with its `index` among them.
    pub fn tool_calls(index: usize, calls: &[crate::tools::ToolCall]) -> Self {
        let calls = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = serde_json::to_value(c).unwrap_or_default();
                v["index"] = Value::from(i);
                v
            })
            .collect();
        Self {
            index,
            delta: ChatDelta {
                role: None,
                content: None,
                tool_calls: Some(calls),
                function_call: None,
            },
            logprobs: None,
            finish_reason: None,
        }
    }

    /// The call of a choice, when the request gave the deprecated
    /// `functions`: `delta.function_call` `{name, arguments}`.
    pub fn function_call(index: usize, call: &crate::tools::FunctionCall) -> Self {
        Self {
            index,
            delta: ChatDelta {
                function_call: serde_json::to_value(call).ok(),
                ..ChatDelta::default()
            },
            logprobs: None,
            finish_reason: None,
        }
    }

    /// The last increment of a choice: empty delta, `finish_reason` set.
    pub fn finish(index: usize, reason: FinishReason) -> Self {
        Self {
            index,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some(reason),
        }
    }
}

/// `delta` of a chat chunk choice; absent fields are not serialized.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Calls, each whole in one delta (with its `index`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// The call of the deprecated `functions`, whole: `{name, arguments}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<Value>,
}
