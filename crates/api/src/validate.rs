//! Request validation: range checks that answer 400 (shape B, naming
//! `param`), and the translation of a request into the engine's
//! [`SamplingParams`] plus what the server needs to run and answer it.
//!
//! Limits: `temperature` in [0, 2]; `top_p` in (0, 1]; `n` in [1, 16];
//! `max_tokens`/`max_completion_tokens` >= 1; penalties in [-2, 2];
//! `repetition_penalty` > 0; `min_p` in [0, 1]; `top_k` >= -1 (-1 and 0 mean
//! off); at most 4 non-empty stop strings; `logit_bias` keys are token ids,
//! values in [-100, 100]; `logprobs`/`top_logprobs` in [0, 20].

use std::collections::BTreeMap;

use hearth_core::{ChatMessage, SamplingParams, MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS};

use crate::chat::{ChatCompletionRequest, MessageContent};
use crate::common::{Stop, StreamOptions, MAX_N};
use crate::completions::{CompletionRequest, Prompt};
use crate::error::ApiError;

/// `max_tokens` of a completion request that gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// One prompt of a completion request, as text or as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated completion request. Choice `i` of prompt `p` has index
/// `p * n + i` (OpenAI's order); the caller varies `params.seed` per choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidCompletion {
    pub model: String,
    /// At least one.
    pub prompts: Vec<PromptInput>,
    /// `max_tokens` is always set (default 16); `logprobs` = `Some(k)` when asked.
    pub params: SamplingParams,
    /// `Some("max_tokens")` when the request set it (a budget the context
    /// cannot hold is then the client's error), `None` for the default.
    pub max_tokens_param: Option<&'static str>,
    /// Choices per prompt, 1 to 16.
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`, only when streaming.
    pub include_usage: bool,
    /// Prepend the prompt to each choice's text.
    pub echo: bool,
    /// Top candidates per token (0 to 20) when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    pub user: Option<String>,
    /// The `guided_*` extension given, if any.
    pub format: crate::output_format::OutputFormat,
}

/// A validated chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidChat {
    pub model: String,
    /// At least one; roles are `system` (also for `developer`), `user` or
    /// `assistant`; text parts joined with `\n`.
    pub messages: Vec<ChatMessage>,
    /// `max_tokens` from `max_completion_tokens`, else `max_tokens`, else `None`.
    pub params: SamplingParams,
    /// The field that set `params.max_tokens`, if any.
    pub max_tokens_param: Option<&'static str>,
    /// Choices, 1 to 16.
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`, only when streaming.
    pub include_usage: bool,
    /// `Some(top_logprobs)` when `logprobs: true`.
    pub logprobs: Option<usize>,
    pub user: Option<String>,
    /// `response_format`: text, or JSON (any object, or of a schema).
    pub format: crate::output_format::OutputFormat,
    /// The tools the model may call (none: answer in text).
    pub tools: Option<crate::tools::ValidTools>,
    /// `messages` as chat templates that know tools take them: `tool`
    /// messages with `tool_call_id`, assistant `tool_calls` with their
    /// `arguments` as objects.
    pub native_messages: Vec<serde_json::Value>,
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::bad_request(Some(param), message)
}

/// The sampling fields both request kinds share.
struct Common<'a> {
    temperature: Option<f64>,
    top_p: Option<f64>,
    n: Option<i64>,
    stop: Option<&'a Stop>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: Option<&'a BTreeMap<String, f64>>,
    seed: Option<i64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    ignore_eos: Option<bool>,
}

/// The [`Common`] fields of a request: both request kinds name them alike.
macro_rules! common {
    ($request:expr) => {
        Common {
            temperature: $request.temperature,
            top_p: $request.top_p,
            n: $request.n,
            stop: $request.stop.as_ref(),
            presence_penalty: $request.presence_penalty,
            frequency_penalty: $request.frequency_penalty,
            logit_bias: $request.logit_bias.as_ref(),
            seed: $request.seed,
            top_k: $request.top_k,
            min_p: $request.min_p,
            repetition_penalty: $request.repetition_penalty,
            ignore_eos: $request.ignore_eos,
        }
    };
}

/// Checks the shared fields; returns the parameters (without `max_tokens`
/// and `logprobs`) and `n`.
fn common_params(c: &Common) -> Result<(SamplingParams, usize), ApiError> {
    let mut p = SamplingParams::default();
    float_param(
        "temperature",
        c.temperature,
        |t| (0.0..=2.0).contains(&t),
        "between 0 and 2",
        &mut p.temperature,
    )?;
    float_param(
        "top_p",
        c.top_p,
        |t| t > 0.0 && t <= 1.0,
        "greater than 0 and at most 1",
        &mut p.top_p,
    )?;
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(invalid(
            "n",
            format!("`n` must be between 1 and {MAX_N}, got {n}."),
        ));
    }
    let penalty = |v: f64| (-2.0..=2.0).contains(&v);
    float_param(
        "presence_penalty",
        c.presence_penalty,
        penalty,
        "between -2 and 2",
        &mut p.presence_penalty,
    )?;
    float_param(
        "frequency_penalty",
        c.frequency_penalty,
        penalty,
        "between -2 and 2",
        &mut p.frequency_penalty,
    )?;
    float_param(
        "repetition_penalty",
        c.repetition_penalty,
        |r| r > 0.0 && r.is_finite(),
        "greater than 0",
        &mut p.repetition_penalty,
    )?;
    float_param(
        "min_p",
        c.min_p,
        |m| (0.0..=1.0).contains(&m),
        "between 0 and 1",
        &mut p.min_p,
    )?;
    if let Some(k) = c.top_k {
        if k < -1 {
            return Err(invalid(
                "top_k",
                format!("`top_k` must be -1 or 0 (disabled) or a positive integer, got {k}."),
            ));
        }
        p.top_k = k.max(0) as usize;
    }
    if let Some(stop) = c.stop {
        let stop = stop.clone().into_vec();
        if stop.len() > MAX_STOP_SEQUENCES {
            return Err(invalid(
                "stop",
                format!(
                    "`stop` may hold at most {MAX_STOP_SEQUENCES} sequences, got {}.",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(invalid(
                "stop",
                "`stop` sequences must not be empty.".to_string(),
            ));
        }
        p.stop = stop;
    }
    if let Some(bias) = c.logit_bias {
        for (key, &value) in bias {
            let id: u32 = key.trim().parse().map_err(|_| {
                invalid(
                    "logit_bias",
                    format!(
                        "`logit_bias` keys must be token ids (non-negative integers), got `{key}`."
                    ),
                )
            })?;
            if !(-100.0..=100.0).contains(&value) {
                return Err(invalid(
                    "logit_bias",
                    format!("`logit_bias` values must be between -100 and 100, got {value} for token {id}."),
                ));
            }
            p.logit_bias.push((id, value as f32));
        }
    }
    p.seed = c.seed.map(|s| s as u64);
    p.ignore_eos = c.ignore_eos.unwrap_or(false);
    Ok((p, n as usize))
}

/// The sampling parameters of a request that only sets `temperature` and
/// `top_p` (the Responses API), checked as chat checks them.
pub(crate) fn temperature_top_p(
    temperature: Option<f64>,
    top_p: Option<f64>,
) -> Result<SamplingParams, ApiError> {
    let c = Common {
        temperature,
        top_p,
        n: None,
        stop: None,
        presence_penalty: None,
        frequency_penalty: None,
        logit_bias: None,
        seed: None,
        top_k: None,
        min_p: None,
        repetition_penalty: None,
        ignore_eos: None,
    };
    common_params(&c).map(|(p, _)| p)
}

/// Checks a token budget named `param` (at least 1).
pub(crate) fn token_budget(param: &str, value: i64) -> Result<usize, ApiError> {
    max_tokens(param, value)
}

/// Checks an optional float parameter: when given it must pass `ok` (else
/// 400 "`name` must be {must}, got {value}.") and goes into `slot`.
fn float_param(
    name: &str,
    value: Option<f64>,
    ok: impl Fn(f64) -> bool,
    must: &str,
    slot: &mut f32,
) -> Result<(), ApiError> {
    if let Some(v) = value {
        if !ok(v) {
            return Err(invalid(name, format!("`{name}` must be {must}, got {v}.")));
        }
        *slot = v as f32;
    }
    Ok(())
}

/// Checks a token budget (`max_tokens` or `max_completion_tokens`).
fn max_tokens(param: &str, value: i64) -> Result<usize, ApiError> {
    if value < 1 {
        return Err(invalid(
            param,
            format!("`{param}` must be at least 1, got {value}."),
        ));
    }
    Ok(value as usize)
}

/// Checks a top-candidates count (`logprobs` or `top_logprobs`).
fn top_count(param: &str, value: i64) -> Result<usize, ApiError> {
    if !(0..=MAX_TOP_LOGPROBS as i64).contains(&value) {
        return Err(invalid(
            param,
            format!("`{param}` must be between 0 and {MAX_TOP_LOGPROBS}, got {value}."),
        ));
    }
    Ok(value as usize)
}

/// `stream_options.include_usage`; `stream_options` without `stream` is a
/// 400, as OpenAI and vLLM answer.
fn include_usage(stream: bool, options: Option<&StreamOptions>) -> Result<bool, ApiError> {
    match options {
        Some(_) if !stream => Err(invalid(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true.".to_string(),
        )),
        options => Ok(options.and_then(|o| o.include_usage).unwrap_or(false)),
    }
}

fn token_ids(ids: &[i64]) -> Result<Vec<u32>, ApiError> {
    if ids.is_empty() {
        return Err(invalid(
            "prompt",
            "`prompt` must not hold an empty list of token ids.".to_string(),
        ));
    }
    ids.iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                invalid(
                    "prompt",
                    format!("`prompt` holds an invalid token id {id}."),
                )
            })
        })
        .collect()
}

impl CompletionRequest {
    /// Checks the request and builds what the engine and the server need.
    pub fn validate(&self) -> Result<ValidCompletion, ApiError> {
        let (mut params, n) = common_params(&common!(self))?;
        let empty = || invalid("prompt", "`prompt` must not be an empty list.".to_string());
        let prompts = match &self.prompt {
            Prompt::Text(text) => vec![PromptInput::Text(text.clone())],
            Prompt::Texts(texts) if texts.is_empty() => return Err(empty()),
            Prompt::Texts(texts) => texts.iter().cloned().map(PromptInput::Text).collect(),
            Prompt::Tokens(ids) => vec![PromptInput::Tokens(token_ids(ids)?)],
            Prompt::TokenBatches(batches) if batches.is_empty() => return Err(empty()),
            Prompt::TokenBatches(batches) => batches
                .iter()
                .map(|ids| token_ids(ids).map(PromptInput::Tokens))
                .collect::<Result<_, _>>()?,
        };
        params.max_tokens = Some(match self.max_tokens {
            Some(v) => max_tokens("max_tokens", v)?,
            None => DEFAULT_COMPLETION_MAX_TOKENS,
        });
        let logprobs = self
            .logprobs
            .map(|k| top_count("logprobs", k))
            .transpose()?;
        params.logprobs = logprobs;
        let echo = self.echo.unwrap_or(false);
        if echo && logprobs.is_some() {
            return Err(invalid(
                "echo",
                "`echo` together with `logprobs` is not supported: log-probabilities of prompt tokens are not computed.".to_string(),
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(invalid(
                "suffix",
                "`suffix` (text that follows the completion, for insertion) is not supported: \
                 the models here only continue a prompt."
                    .to_string(),
            ));
        }
        if let Some(best_of) = self.best_of {
            if best_of != 1 && best_of != n as i64 {
                return Err(invalid(
                    "best_of",
                    format!("`best_of` other than 1 or `n` is not supported, got {best_of}."),
                ));
            }
        }
        let stream = self.stream.unwrap_or(false);
        Ok(ValidCompletion {
            model: self.model.clone(),
            prompts,
            params,
            max_tokens_param: self.max_tokens.map(|_| "max_tokens"),
            n,
            stream,
            include_usage: include_usage(stream, self.stream_options.as_ref())?,
            echo,
            logprobs,
            user: self.user.clone(),
            format: crate::output_format::Guided {
                json: self.guided_json.as_ref(),
                regex: self.guided_regex.as_deref(),
                choice: self.guided_choice.as_deref(),
                grammar: self.guided_grammar.as_deref(),
            }
            .format()?
            .unwrap_or_default(),
        })
    }
}

impl ChatCompletionRequest {
    /// Checks the request and builds what the engine and the server need.
    pub fn validate(&self) -> Result<ValidChat, ApiError> {
        let (messages, native_messages) = self.flatten_messages()?;
        crate::tool_turns::check(&self.messages)?;
        crate::chat_unsupported::check(self)?;
        let (mut params, n) = common_params(&common!(self))?;
        let max_tokens_value = self
            .max_tokens
            .map(|v| max_tokens("max_tokens", v))
            .transpose()?;
        let max_completion = self
            .max_completion_tokens
            .map(|v| max_tokens("max_completion_tokens", v))
            .transpose()?;
        params.max_tokens = max_completion.or(max_tokens_value);
        let max_tokens_param = if max_completion.is_some() {
            Some("max_completion_tokens")
        } else {
            max_tokens_value.map(|_| "max_tokens")
        };
        let top = self
            .top_logprobs
            .map(|k| top_count("top_logprobs", k))
            .transpose()?;
        let logprobs = if self.logprobs.unwrap_or(false) {
            Some(top.unwrap_or(0))
        } else {
            if top.unwrap_or(0) > 0 {
                return Err(invalid(
                    "top_logprobs",
                    "`top_logprobs` requires `logprobs` to be true.".to_string(),
                ));
            }
            None
        };
        params.logprobs = logprobs;
        let stream = self.stream.unwrap_or(false);
        let format = crate::output_format::OutputFormat::parse(
            self.response_format.as_ref(),
            "response_format",
        )?;
        let guided = crate::output_format::Guided {
            json: self.guided_json.as_ref(),
            regex: self.guided_regex.as_deref(),
            choice: self.guided_choice.as_deref(),
            grammar: self.guided_grammar.as_deref(),
        }
        .format()?;
        let format = match (format, guided) {
            (format, None) => format,
            (crate::output_format::OutputFormat::Text, Some(guided)) => guided,
            (_, Some(_)) => {
                return Err(invalid(
                    "response_format",
                    "Give `response_format` or a `guided_*` field, not both.".to_string(),
                ))
            }
        };
        let legacy = crate::legacy_functions::parse(
            self.functions.as_ref(),
            self.function_call.as_ref(),
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
        )?;
        let tools = match legacy {
            Some(tools) => tools,
            None => crate::tools::ValidTools::parse(
                self.tools.as_ref(),
                self.tool_choice.as_ref(),
                self.parallel_tool_calls,
            )?,
        };
        if tools.is_some() && format != crate::output_format::OutputFormat::Text {
            return Err(invalid(
                "response_format",
                "`response_format` cannot be combined with `tools`: a tool call's arguments already follow their schema.".to_string(),
            ));
        }
        Ok(ValidChat {
            model: self.model.clone(),
            messages,
            params,
            max_tokens_param,
            n,
            stream,
            include_usage: include_usage(stream, self.stream_options.as_ref())?,
            logprobs,
            user: self.user.clone(),
            format,
            tools,
            native_messages,
        })
    }

    /// Checks roles and content parts; flattens content to text. Also
    /// gives the messages in the form templates that know tools take.
    fn flatten_messages(&self) -> Result<(Vec<ChatMessage>, Vec<serde_json::Value>), ApiError> {
        if self.messages.is_empty() {
            return Err(invalid(
                "messages",
                "`messages` must hold at least one message.".to_string(),
            ));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        let mut native = Vec::with_capacity(self.messages.len());
        for (i, message) in self.messages.iter().enumerate() {
            let role = match message.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                // A tool's result goes back as a user turn, which every
                // chat template knows (`function`: the deprecated form).
                "tool" | "function" => "user",
                other => {
                    return Err(invalid(
                        &format!("messages[{i}].role"),
                        format!(
                            "Role `{other}` is not supported; use `system`, `developer`, `user`, `assistant` or `tool`."
                        ),
                    ))
                }
            };
            let content = match &message.content {
                Some(MessageContent::Text(text)) => text.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for (j, part) in parts.iter().enumerate() {
                        if part.kind != "text" {
                            return Err(invalid(
                                &format!("messages[{i}].content[{j}].type"),
                                format!(
                                    "Content parts of type `{}` are not supported; only `text` is.",
                                    part.kind
                                ),
                            ));
                        }
                        let text = part.text.as_ref().ok_or_else(|| {
                            invalid(
                                &format!("messages[{i}].content[{j}].text"),
                                "A content part of type `text` needs a `text` string.".to_string(),
                            )
                        })?;
                        texts.push(text.as_str());
                    }
                    texts.join("\n")
                }
                None if role == "assistant" => String::new(),
                None => {
                    return Err(invalid(
                        &format!("messages[{i}].content"),
                        format!("A message with role `{}` needs `content`.", message.role),
                    ))
                }
            };
            // The deprecated forms: a `function_call` is a call named by
            // its function, a `function` message answers it by `name`.
            let legacy_calls = message
                .function_call
                .as_ref()
                .filter(|c| !c.is_null() && message.tool_calls.is_none())
                .map(|c| serde_json::json!([{"id": c["name"], "type": "function", "function": c}]));
            let tool_calls = legacy_calls.as_ref().or(message.tool_calls.as_ref());
            let call_id = match message.role.as_str() {
                "function" => Some(message.name.as_deref().ok_or_else(|| {
                    invalid(
                        &format!("messages[{i}].name"),
                        "A `function` message needs the `name` of the function it answers."
                            .to_string(),
                    )
                })?),
                _ => message.tool_call_id.as_deref(),
            };
            native.push(crate::tools::native_message(
                role,
                message.role == "tool" || message.role == "function",
                &content,
                tool_calls,
                call_id,
            ));
            let content = match (message.role.as_str(), tool_calls) {
                ("assistant", Some(calls)) if !calls.is_null() => {
                    let calls = crate::tools::calls_as_text(calls);
                    if content.is_empty() {
                        calls
                    } else {
                        format!("{content}\n{calls}")
                    }
                }
                ("tool", _) if message.tool_call_id.is_none() => {
                    return Err(invalid(
                        &format!("messages[{i}].tool_call_id"),
                        "A `tool` message needs the `tool_call_id` it answers.".to_string(),
                    ))
                }
                ("tool" | "function", _) => {
                    crate::tools::tool_result_text(call_id.unwrap_or(""), &content)
                }
                _ => content,
            };
            out.push(ChatMessage {
                role: role.to_string(),
                content,
            });
        }
        Ok((out, native))
    }
}
