//! `POST /v1/responses`: the request, its validation, and (in [`objects`])
//! the response object, its stream events and the stored-response lists.
//!
//! What Hearth cannot honour is refused with 400 shape B naming the field,
//! never ignored: tools other than functions, `reasoning`, `background`,
//! `conversation`, `prompt`, `include` values other than
//! `message.output_text.logprobs`, `text.verbosity` other than `medium`,
//! and images or files in `input`.

pub mod items;
pub mod objects;

use std::collections::BTreeMap;

use hearth_core::{SamplingParams, MAX_TOP_LOGPROBS};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::output_format::OutputFormat;
use crate::tools::{ToolShape, ValidTools};
use crate::validate::{temperature_top_p, token_budget};

pub use items::{chat_messages, check_outputs, native_messages, CallTurn, ConversationItem};
pub use objects::*;

/// Most `metadata` pairs, and the longest key and value (OpenAI's limits).
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;

/// The `include` value that adds log-probabilities to `output_text` parts
/// (the only one Hearth has anything to add for).
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Body of `POST /v1/responses`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseRequest {
    pub model: String,
    /// A user message as a string, or a list of message items.
    pub input: ResponseInput,
    /// A system message put first, for this turn only (not carried over
    /// by `previous_response_id`).
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Keep the response (default true), for `GET /v1/responses/{id}` and
    /// `previous_response_id`.
    #[serde(default)]
    pub store: Option<bool>,
    /// Continue the conversation of this stored response.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Up to 16 string pairs, echoed back.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub text: Option<TextConfig>,
    /// `disabled` (default: a conversation the context cannot hold is a
    /// 400) or `auto` (its oldest turns are dropped to fit).
    #[serde(default)]
    pub truncation: Option<String>,
    /// Function tools: `{type: "function", name, description, parameters,
    /// strict}`. Calls come back as `function_call` output items.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto` (default), `required`, or `{type: "function", name}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// Not supported: false or absent.
    #[serde(default)]
    pub background: Option<bool>,
    /// Extra output: `message.output_text.logprobs` (the only value).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// 0 to 20: the most likely tokens given beside each output token's
    /// log-probability (with `include` `message.output_text.logprobs`).
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// Not supported: null or absent.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// Not supported (stored prompt templates): null or absent.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub prompt: Option<Value>,
}

/// `input`: a string (one user message) or a list of items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// One item of `input`: a message (`type` `message` or absent), a
/// `function_call` the model made (`call_id`, `name`, `arguments`) or a
/// `function_call_output` (`call_id`, `output`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputItem {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<ItemContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// A string, or a list of `input_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// A message's content: text, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ItemPart>),
}

/// A content part: `input_text` (or `output_text` in assistant items).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ItemPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `text`: how the output is formatted (`format`, default `text`) and
/// `verbosity` (only `medium`, the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TextConfig {
    #[serde(default = "TextFormat::text")]
    pub format: TextFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

impl Default for TextConfig {
    fn default() -> Self {
        Self {
            format: TextFormat::text(),
            verbosity: None,
        }
    }
}

impl TextFormat {
    /// `{"type": "text"}`.
    pub fn text() -> Self {
        Self {
            kind: "text".to_string(),
            name: None,
            schema: None,
            strict: None,
            description: None,
        }
    }
}

/// `text.format`: `text`, `json_object`, or `json_schema` with `name`,
/// `schema` (and `strict`, `description`) beside `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidResponse {
    pub model: String,
    pub instructions: Option<String>,
    /// This turn's items, at least one.
    pub input: Vec<ConversationItem>,
    /// `max_tokens` from `max_output_tokens`; `temperature`, `top_p`.
    pub params: SamplingParams,
    pub max_output_tokens: Option<i64>,
    pub stream: bool,
    pub store: bool,
    pub previous_response_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub user: Option<String>,
    /// `truncation: auto`.
    pub truncate: bool,
    /// The echoed settings.
    pub temperature: f64,
    pub top_p: f64,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    /// `text.format`: text, or JSON (any object, or of a schema).
    pub format: OutputFormat,
    /// `text` as given, echoed in the response object.
    pub text: TextConfig,
    /// The functions the model may call (none: it answers in text).
    pub tools: Option<ValidTools>,
    /// `tools` as given, echoed.
    pub tools_given: Vec<Value>,
    /// `include` has `message.output_text.logprobs`: `output_text` parts
    /// and text deltas carry their tokens' log-probabilities
    /// (`params.logprobs` is then set).
    pub logprobs: bool,
    /// `top_logprobs` as given, echoed.
    pub top_logprobs: Option<i64>,
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), message)
}

impl ResponseRequest {
    /// Checks the request (400 shape B naming the field).
    pub fn validate(&self) -> Result<ValidResponse, ApiError> {
        self.check_unsupported()?;
        let input = match &self.input {
            ResponseInput::Text(text) => vec![ConversationItem::message("user", text.clone())],
            ResponseInput::Items(items) if items.is_empty() => {
                return Err(invalid("input", "`input` must hold at least one item."))
            }
            ResponseInput::Items(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| ConversationItem::from_input(i, item))
                .collect::<Result<_, _>>()?,
        };
        let mut params = temperature_top_p(self.temperature, self.top_p)?;
        params.max_tokens = self
            .max_output_tokens
            .map(|v| token_budget("max_output_tokens", v))
            .transpose()?;
        let logprobs = self.check_include()?;
        let top = match self.top_logprobs {
            Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                return Err(invalid(
                    "top_logprobs",
                    format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}."),
                ))
            }
            k => k.unwrap_or(0) as usize,
        };
        params.logprobs = logprobs.then_some(top);
        let metadata = self.metadata.clone().unwrap_or_default();
        check_metadata(&metadata)?;
        let truncate = match self.truncation.as_deref() {
            None | Some("disabled") => false,
            Some("auto") => true,
            Some(other) => {
                return Err(invalid(
                    "truncation",
                    format!("`truncation` must be `auto` or `disabled`, got `{other}`."),
                ))
            }
        };
        if let Some(id) = &self.previous_response_id {
            if id.is_empty() {
                return Err(invalid(
                    "previous_response_id",
                    "`previous_response_id` must not be empty.",
                ));
            }
        }
        let format = match &self.text {
            None => OutputFormat::Text,
            Some(text) => check_text(text)?,
        };
        let tools_given = self.tools.clone().unwrap_or_default();
        let tools = ValidTools::parse_shaped(
            Some(&Value::Array(tools_given.clone())),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
            ToolShape::Flat,
        )?;
        if tools.is_some() && format != OutputFormat::Text {
            return Err(invalid(
                "text.format",
                "`text.format` cannot be combined with `tools`: a call's arguments already follow their schema.",
            ));
        }
        Ok(ValidResponse {
            model: self.model.clone(),
            instructions: self.instructions.clone().filter(|i| !i.is_empty()),
            input,
            params,
            max_output_tokens: self.max_output_tokens,
            stream: self.stream.unwrap_or(false),
            store: self.store.unwrap_or(true),
            previous_response_id: self.previous_response_id.clone(),
            metadata,
            user: self.user.clone(),
            truncate,
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            tool_choice: self
                .tool_choice
                .clone()
                .unwrap_or_else(|| Value::String("auto".to_string())),
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
            format,
            text: self.text.clone().unwrap_or_default(),
            tools,
            tools_given,
            logprobs,
            top_logprobs: self.top_logprobs,
        })
    }

    /// `include`: true when it asks for log-probabilities; any other value
    /// is refused.
    fn check_include(&self) -> Result<bool, ApiError> {
        let include = self.include.as_deref().unwrap_or_default();
        if let Some(other) = include.iter().find(|v| *v != INCLUDE_LOGPROBS) {
            return Err(invalid(
                "include",
                format!(
                    "`include` value `{other}` is not supported: the only one is \
                     `{INCLUDE_LOGPROBS}` (Hearth runs no hosted tools, reasoning or \
                     image inputs whose results could be included)."
                ),
            ));
        }
        Ok(!include.is_empty())
    }

    fn check_unsupported(&self) -> Result<(), ApiError> {
        if self.reasoning.as_ref().is_some_and(|r| {
            !r.is_null()
                && r.as_object()
                    .is_none_or(|o| o.values().any(|v| !v.is_null()))
        }) {
            return Err(invalid(
                "reasoning",
                "`reasoning` is not supported: the served models have no reasoning settings.",
            ));
        }
        if self.background == Some(true) {
            return Err(invalid(
                "background",
                "Background responses are not supported: use `stream`, or the Batch API.",
            ));
        }
        if self.conversation.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(invalid(
                "conversation",
                "`conversation` is not supported: continue a conversation with `previous_response_id`.",
            ));
        }
        if self.prompt.as_ref().is_some_and(|p| !p.is_null()) {
            return Err(invalid(
                "prompt",
                "`prompt` (stored prompt templates) is not supported: give `instructions` and `input`.",
            ));
        }
        Ok(())
    }
}

/// `text`: its `format` (a `json_schema` needs its `schema`), and
/// `verbosity`, which only `medium` (what every served model does) passes.
fn check_text(text: &TextConfig) -> Result<OutputFormat, ApiError> {
    match text.verbosity.as_deref() {
        None | Some("medium") => {}
        Some(other) => {
            return Err(invalid(
                "text.verbosity",
                format!("`text.verbosity` `{other}` is not supported: the served models have no verbosity setting (only `medium` is accepted)."),
            ))
        }
    }
    let value = serde_json::to_value(&text.format).unwrap_or(Value::Null);
    let format = OutputFormat::parse(Some(&value), "text.format")?;
    if text.format.kind == "json_schema" && text.format.schema.is_none() {
        return Err(invalid(
            "text.format.schema",
            "`text.format.schema` is required with `type` `json_schema`.",
        ));
    }
    Ok(format)
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(invalid(
            "metadata",
            format!(
                "`metadata` may hold at most {MAX_METADATA_PAIRS} pairs, got {}.",
                metadata.len()
            ),
        ));
    }
    for (key, value) in metadata {
        if key.chars().count() > MAX_METADATA_KEY {
            return Err(invalid(
                "metadata",
                format!("`metadata` keys may be at most {MAX_METADATA_KEY} characters."),
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE {
            return Err(invalid(
                "metadata",
                format!("`metadata` values may be at most {MAX_METADATA_VALUE} characters (key `{key}`)."),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<ValidResponse, ApiError> {
        serde_json::from_value::<ResponseRequest>(body)
            .expect("parses")
            .validate()
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let v = request(serde_json::json!({"model": "m", "input": "hi"})).unwrap();
        assert_eq!(v.input, vec![ConversationItem::message("user", "hi")]);
        assert!(v.store && !v.stream && !v.truncate);
        assert_eq!(v.params.max_tokens, None);
    }

    #[test]
    fn message_items_keep_roles_and_join_text_parts() {
        let v = request(
            serde_json::json!({"model": "m", "max_output_tokens": 5, "input": [
                {"role": "developer", "content": "be brief"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
            ]}),
        )
        .unwrap();
        let roles: Vec<_> = chat_messages(&v.input)
            .into_iter()
            .map(|m| m.role)
            .collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        assert_eq!(v.input[1], ConversationItem::message("user", "a\nb"));
        assert_eq!(v.params.max_tokens, Some(5));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let cases = [
            (
                serde_json::json!({"tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                serde_json::json!({"tools": [{"type": "function", "name": "a b"}]}),
                "tools[0].name",
            ),
            (
                serde_json::json!({"tools": [{"type": "function", "name": "f"}],
                    "tool_choice": {"type": "function", "name": "g"}}),
                "tool_choice",
            ),
            (
                serde_json::json!({"tools": [{"type": "function", "name": "f"}],
                    "text": {"format": {"type": "json_object"}}}),
                "text.format",
            ),
            (
                serde_json::json!({"tool_choice": "required"}),
                "tool_choice",
            ),
            (
                serde_json::json!({"reasoning": {"effort": "high"}}),
                "reasoning",
            ),
            (serde_json::json!({"background": true}), "background"),
            (
                serde_json::json!({"text": {"format": {"type": "yaml"}}}),
                "text.format",
            ),
            (serde_json::json!({"truncation": "middle"}), "truncation"),
            (
                serde_json::json!({"max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (serde_json::json!({"temperature": 3}), "temperature"),
            (serde_json::json!({"input": []}), "input"),
            (
                serde_json::json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (
                serde_json::json!({"input": [{"type": "function_call_output", "call_id": "c"}]}),
                "input[0].output",
            ),
            (
                serde_json::json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}),
                "input[0].arguments",
            ),
            (
                serde_json::json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
            ),
            (
                serde_json::json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (serde_json::json!({"include": ["bogus.thing"]}), "include"),
            (
                serde_json::json!({"include": [INCLUDE_LOGPROBS, "file_search_call.results"]}),
                "include",
            ),
            (
                serde_json::json!({"include": ["web_search_call.action.sources"]}),
                "include",
            ),
            (serde_json::json!({"top_logprobs": 21}), "top_logprobs"),
            (serde_json::json!({"top_logprobs": -1}), "top_logprobs"),
            (
                serde_json::json!({"conversation": "conv_123"}),
                "conversation",
            ),
            (
                serde_json::json!({"prompt": {"id": "pmpt_1", "version": "2"}}),
                "prompt",
            ),
            (
                serde_json::json!({"text": {"verbosity": "low"}}),
                "text.verbosity",
            ),
            (
                serde_json::json!({"text": {"format": {"type": "json_schema", "name": "x"}}}),
                "text.format.schema",
            ),
        ];
        for (extra, param) in cases {
            let mut body = serde_json::json!({"model": "m", "input": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let e = request(body.clone()).unwrap_err();
            assert_eq!((e.status(), e.param()), (400, Some(param)), "{body}");
        }
        let many: BTreeMap<String, String> = (0..17).map(|i| (i.to_string(), "v".into())).collect();
        let e =
            request(serde_json::json!({"model": "m", "input": "x", "metadata": many})).unwrap_err();
        assert_eq!(e.param(), Some("metadata"));
        // Empty tools and `auto` / `none` are fine.
        request(serde_json::json!({"model": "m", "input": "x", "tools": [], "tool_choice": "none", "reasoning": null})).unwrap();
    }

    #[test]
    fn include_asks_for_logprobs_and_text_may_leave_format_out() {
        let v = request(serde_json::json!({"model": "m", "input": "hi",
            "include": [INCLUDE_LOGPROBS], "top_logprobs": 2}))
        .unwrap();
        assert!(v.logprobs);
        assert_eq!((v.params.logprobs, v.top_logprobs), (Some(2), Some(2)));
        let v = request(
            serde_json::json!({"model": "m", "input": "hi", "include": [INCLUDE_LOGPROBS]}),
        )
        .unwrap();
        assert_eq!((v.params.logprobs, v.top_logprobs), (Some(0), None));
        // `top_logprobs` alone is echoed; no log-probabilities are computed.
        let v = request(
            serde_json::json!({"model": "m", "input": "hi", "top_logprobs": 3,
            "include": [], "conversation": null, "prompt": null}),
        )
        .unwrap();
        assert_eq!(
            (v.logprobs, v.params.logprobs, v.top_logprobs),
            (false, None, Some(3))
        );
        for text in [
            serde_json::json!({}),
            serde_json::json!({"verbosity": "medium"}),
            serde_json::json!({"verbosity": null}),
        ] {
            let v =
                request(serde_json::json!({"model": "m", "input": "hi", "text": text})).unwrap();
            assert_eq!(v.format, OutputFormat::Text, "{text}");
            assert_eq!(v.text.format, TextFormat::text());
        }
        let v = request(
            serde_json::json!({"model": "m", "input": "hi", "text": {"format":
            {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}),
        )
        .unwrap();
        assert!(matches!(v.format, OutputFormat::JsonSchema { .. }));
    }

    #[test]
    fn function_tools_and_call_items_are_read() {
        let v = request(serde_json::json!({"model": "m",
            "tools": [{"type": "function", "name": "get_weather", "strict": true,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "cold"}]},
            ]}))
        .unwrap();
        let tools = v.tools.expect("tools");
        assert_eq!(
            tools.choice,
            crate::tools::ToolChoice::Named("get_weather".into())
        );
        assert_eq!(v.tools_given.len(), 1);
        assert_eq!(
            v.input[2],
            ConversationItem::FunctionOutput {
                call_id: "c1".into(),
                output: "cold".into()
            }
        );
        let none = request(serde_json::json!({"model": "m", "input": "x",
            "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"}))
        .unwrap();
        assert!(none.tools.is_none());
    }
}
