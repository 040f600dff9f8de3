//! What `/v1/responses` answers: the response object (OpenAI's field
//! names), the typed stream events, the input-item list and the deletion.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::{ConversationItem, TextConfig, ValidResponse};
use crate::chat::ChatTokenLogprob;
use crate::error::ApiError;

/// A response. `status` is `in_progress` (only in stream events),
/// `completed`, `incomplete` (`incomplete_details.reason` =
/// `max_output_tokens`) or `failed` (with `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// `response`.
    pub object: String,
    pub created_at: u64,
    pub status: String,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Reasoning,
    pub service_tier: String,
    pub store: bool,
    pub temperature: f64,
    pub text: TextConfig,
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// `top_logprobs` as asked (null when not).
    pub top_logprobs: Option<i64>,
    pub top_p: f64,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
}

/// `error` of a failed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

/// Why a response is `incomplete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IncompleteDetails {
    pub reason: String,
}

/// `reasoning`: always empty (the served models have no such settings).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reasoning {
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// An item of `output`: the assistant's message, or one of its function
/// calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message(OutputMessage),
    FunctionCall(FunctionToolCall),
}

/// A function call the model made: `call_id` is what its
/// `function_call_output` names; `arguments` is a JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionToolCall {
    /// `fc_...`.
    pub id: String,
    /// `call_...`.
    pub call_id: String,
    pub name: String,
    pub arguments: String,
    /// `in_progress` (arguments still streaming) or `completed`.
    pub status: String,
}

/// The assistant message of `output` (`type` `message`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputMessage {
    /// `msg_...`.
    pub id: String,
    pub status: String,
    /// `assistant`.
    pub role: String,
    pub content: Vec<OutputText>,
}

/// A text part of an output message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    /// Each output token's log-probability with its `top_logprobs` most
    /// likely alternatives with `include` `message.output_text.logprobs`;
    /// empty otherwise (as OpenAI prints it, and as the deltas carry it).
    #[serde(default)]
    pub logprobs: Vec<ChatTokenLogprob>,
}

impl OutputMessage {
    /// The assistant message `id` with `status`, and its text when there is
    /// one yet.
    pub fn assistant(id: &str, status: &str, text: Option<OutputText>) -> Self {
        Self {
            id: id.to_string(),
            status: status.to_string(),
            role: "assistant".to_string(),
            content: text.into_iter().collect(),
        }
    }
}

impl OutputText {
    /// A text part; `logprobs` when they were asked for (else empty).
    pub fn new(text: String, logprobs: Option<Vec<ChatTokenLogprob>>) -> Self {
        Self {
            kind: "output_text".to_string(),
            text,
            annotations: Vec::new(),
            logprobs: logprobs.unwrap_or_default(),
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    pub fn new(input_tokens: usize, output_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            input_tokens,
            input_tokens_details: InputTokensDetails { cached_tokens },
            output_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: input_tokens + output_tokens,
        }
    }
}

impl ResponseObject {
    /// An `in_progress` response with no output yet, echoing `request`'s
    /// settings.
    pub fn start(id: String, created_at: u64, request: &ValidResponse) -> Self {
        Self {
            id,
            object: "response".to_string(),
            created_at,
            status: "in_progress".to_string(),
            background: false,
            error: None,
            incomplete_details: None,
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            metadata: request.metadata.clone(),
            model: request.model.clone(),
            output: Vec::new(),
            parallel_tool_calls: request.parallel_tool_calls,
            previous_response_id: request.previous_response_id.clone(),
            reasoning: Reasoning::default(),
            service_tier: crate::common::SERVICE_TIER.to_string(),
            store: request.store,
            temperature: request.temperature,
            text: request.text.clone(),
            tool_choice: request.tool_choice.clone(),
            tools: request.tools_given.clone(),
            top_logprobs: request.top_logprobs,
            top_p: request.top_p,
            truncation: if request.truncate { "auto" } else { "disabled" }.to_string(),
            usage: None,
            user: request.user.clone(),
        }
    }

    /// Ends the response with its text part: `completed`, or `incomplete`
    /// when `max_output_tokens` cut it.
    pub fn finish(
        &mut self,
        message_id: String,
        text: OutputText,
        cut: bool,
        usage: ResponseUsage,
    ) {
        let status = if cut { "incomplete" } else { "completed" };
        self.status = status.to_string();
        self.incomplete_details = cut.then(|| IncompleteDetails {
            reason: "max_output_tokens".to_string(),
        });
        self.output = vec![OutputItem::Message(OutputMessage::assistant(
            &message_id,
            status,
            Some(text),
        ))];
        self.usage = Some(usage);
    }

    /// Ends the response with the model's function calls (`completed`).
    pub fn finish_calls(&mut self, calls: Vec<FunctionToolCall>, usage: ResponseUsage) {
        self.status = "completed".to_string();
        self.output = calls.into_iter().map(OutputItem::FunctionCall).collect();
        self.usage = Some(usage);
    }

    /// What the output adds to the conversation.
    pub fn turns(&self) -> Vec<ConversationItem> {
        self.output
            .iter()
            .map(|item| match item {
                OutputItem::Message(m) => ConversationItem::message(
                    "assistant",
                    m.content
                        .iter()
                        .map(|c| c.text.as_str())
                        .collect::<String>(),
                ),
                OutputItem::FunctionCall(c) => ConversationItem::FunctionCall(super::CallTurn {
                    call_id: c.call_id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                }),
            })
            .collect()
    }

    /// Ends the response as `failed` with `error`.
    pub fn fail(&mut self, error: &ApiError) {
        self.status = "failed".to_string();
        self.error = Some(ResponseError {
            code: error_code(error),
            message: error.message(),
        });
    }

    /// The text of every `output_text` part (what the SDK's `output_text` is).
    pub fn output_text(&self) -> String {
        self.output
            .iter()
            .filter_map(|item| match item {
                OutputItem::Message(m) => Some(m),
                OutputItem::FunctionCall(_) => None,
            })
            .flat_map(|m| m.content.iter().map(|c| c.text.as_str()))
            .collect()
    }
}

/// The string `code` of an error in a response or an `error` event.
fn error_code(error: &ApiError) -> String {
    match error.body() {
        crate::error::ErrorBody::Upstream { code, .. } => code.to_string(),
        _ => error.status().to_string(),
    }
}

/// Log-probabilities as JSON through their text, so that the f32 numbers
/// read as the response object gives them (not widened to f64 digits).
fn exact(logprobs: &[ChatTokenLogprob]) -> Value {
    exact_value(logprobs).unwrap_or_else(|| json!([]))
}

/// `value` as JSON through its text, so that f32 numbers (log-probabilities)
/// keep their shortest form instead of widening to f64's digits: every
/// event then prints a number exactly as the others and the stored
/// response do.
fn exact_value<T: Serialize + ?Sized>(value: &T) -> Option<Value> {
    serde_json::to_string(value)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
}

/// The stream's events, each with its `sequence_number` (from 0, one more
/// per event).
#[derive(Debug, Default)]
pub struct EventSequence {
    next: u64,
}

impl EventSequence {
    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.next);
        self.next += 1;
        fields
    }

    /// `response.created`, `response.in_progress`, ... with the response.
    pub fn response(&mut self, kind: &str, response: &ResponseObject) -> Value {
        self.event(kind, json!({ "response": exact_value(response) }))
    }

    /// `response.output_item.added` (`in_progress`, no content) or
    /// `response.output_item.done` (the whole item), at `index` of `output`.
    pub fn item(&mut self, kind: &str, index: usize, item: &OutputItem) -> Value {
        self.event(
            kind,
            json!({ "output_index": index, "item": exact_value(item) }),
        )
    }

    /// `response.content_part.added` / `.done` (of the message, the first
    /// output item).
    pub fn part(&mut self, kind: &str, item_id: &str, part: &OutputText) -> Value {
        self.event(
            kind,
            json!({
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "part": exact_value(part),
            }),
        )
    }

    /// `response.output_text.delta`, with the log-probabilities of the
    /// tokens that gave it (empty unless asked for).
    pub fn delta(&mut self, item_id: &str, delta: &str, logprobs: &[ChatTokenLogprob]) -> Value {
        self.event(
            "response.output_text.delta",
            json!({
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "delta": delta, "logprobs": exact(logprobs),
            }),
        )
    }

    /// `response.output_text.done`, with the whole part's
    /// log-probabilities (empty unless asked for).
    pub fn text_done(&mut self, item_id: &str, part: &OutputText) -> Value {
        self.event(
            "response.output_text.done",
            json!({
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "text": part.text,
                "logprobs": exact(&part.logprobs),
            }),
        )
    }

    /// `response.function_call_arguments.delta` of the call at `index`.
    pub fn arguments_delta(&mut self, index: usize, call: &FunctionToolCall, delta: &str) -> Value {
        self.event(
            "response.function_call_arguments.delta",
            json!({ "item_id": call.id, "output_index": index, "delta": delta }),
        )
    }

    /// `response.function_call_arguments.done` of the call at `index`.
    pub fn arguments_done(&mut self, index: usize, call: &FunctionToolCall) -> Value {
        self.event(
            "response.function_call_arguments.done",
            json!({
                "item_id": call.id, "output_index": index,
                "name": call.name, "arguments": call.arguments,
            }),
        )
    }

    /// The spec's in-stream failure: `{type: "error", code, message, param,
    /// sequence_number}`.
    pub fn error(&mut self, error: &ApiError) -> Value {
        self.event(
            "error",
            json!({
                "code": error_code(error),
                "message": error.message(),
                "param": error.param(),
            }),
        )
    }
}

/// An item of `GET /v1/responses/{id}/input_items`, as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItemObject {
    Message(InputMessageObject),
    FunctionCall(FunctionToolCall),
    FunctionCallOutput(FunctionOutputObject),
}

/// A message of `input`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputMessageObject {
    /// `msg_...`.
    pub id: String,
    pub role: String,
    pub status: String,
    pub content: Vec<InputContentPart>,
}

/// A `function_call_output` of `input`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionOutputObject {
    /// `fco_...`.
    pub id: String,
    pub call_id: String,
    pub output: String,
    pub status: String,
}

/// A text part of an input item: `input_text` (`output_text` for
/// assistant messages).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

impl InputItemObject {
    /// `item` with the id `new_id` gives for its kind (`msg`, `fc`, `fco`).
    pub fn new(item: &ConversationItem, new_id: impl Fn(&str) -> String) -> Self {
        let status = "completed".to_string();
        match item {
            ConversationItem::Message { role, text } => {
                let kind = if role == "assistant" {
                    "output_text"
                } else {
                    "input_text"
                };
                Self::Message(InputMessageObject {
                    id: new_id("msg"),
                    role: role.clone(),
                    status,
                    content: vec![InputContentPart {
                        kind: kind.to_string(),
                        text: text.clone(),
                    }],
                })
            }
            ConversationItem::FunctionCall(c) => Self::FunctionCall(FunctionToolCall {
                id: new_id("fc"),
                call_id: c.call_id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
                status,
            }),
            ConversationItem::FunctionOutput { call_id, output } => {
                Self::FunctionCallOutput(FunctionOutputObject {
                    id: new_id("fco"),
                    call_id: call_id.clone(),
                    output: output.clone(),
                    status,
                })
            }
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Self::Message(m) => &m.id,
            Self::FunctionCall(c) => &c.id,
            Self::FunctionCallOutput(o) => &o.id,
        }
    }
}

/// `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputItemList {
    pub object: String,
    pub data: Vec<InputItemObject>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

impl InputItemList {
    pub fn new(data: Vec<InputItemObject>, has_more: bool) -> Self {
        Self {
            object: crate::common::OBJECT_LIST.to_string(),
            first_id: data.first().map(|i| i.id().to_string()),
            last_id: data.last().map(|i| i.id().to_string()),
            data,
            has_more,
        }
    }
}

/// Query of `GET /v1/responses/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// Only `false` (or absent): OpenAI streams a background response's
    /// events again, and no response here runs in the background.
    /// pydantic's booleans (`true`, `1`, `yes`, `on`, ...).
    #[serde(default, deserialize_with = "crate::de::deserialize_lenient_opt_bool")]
    #[param(value_type = Option<bool>)]
    pub stream: Option<bool>,
    /// The project to look in first (the response is found in any
    /// project the key reaches).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

/// Query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InputItemsQuery {
    /// 1 to 100 (default 20).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Items after this item id.
    #[serde(default)]
    pub after: Option<String>,
    /// `asc` or `desc` (default).
    #[serde(default)]
    pub order: Option<String>,
    /// The project to look in first (the response is found in any
    /// project the key reaches).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseDeleted {
    pub id: String,
    /// `response.deleted`.
    pub object: String,
    pub deleted: bool,
}

/// `POST /v1/responses/input_tokens`: how many tokens the request's input
/// takes as the model sees it (instructions, tools, the conversation of
/// `previous_response_id`, `truncation`), before anything is generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputTokens {
    /// `response.input_tokens`.
    pub object: String,
    pub input_tokens: usize,
}

impl InputTokens {
    pub fn new(input_tokens: usize) -> Self {
        Self {
            object: "response.input_tokens".to_string(),
            input_tokens,
        }
    }
}
