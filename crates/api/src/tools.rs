//! Function calling on chat completions: `tools`, `tool_choice` and
//! `parallel_tool_calls` checked into [`ValidTools`], which says what the
//! model is told (a system message listing the tools and the call format),
//! what grammar its output must follow, and how that output becomes
//! `tool_calls`.
//!
//! The model calls tools by answering with a JSON array
//! `[{"name": ..., "arguments": {...}}]`. With `tool_choice` `required` or
//! a named function the whole answer must be such an array (of that
//! function); with `auto` the grammar lets the first character decide: `[`
//! starts calls, anything else is a plain answer. An answer holds one
//! call when `parallel_tool_calls` is false or a function is named (as
//! vLLM's named choice), else at most [`MAX_PARALLEL_CALLS`]; identical
//! calls (the same function with the same arguments) are returned once.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::ApiError;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

impl ToolDef {
    /// `{name, description, parameters}`, as the model is shown the tool.
    fn described(&self) -> Value {
        let mut o = Map::new();
        o.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            o.insert("description".into(), json!(d));
        }
        o.insert("parameters".into(), self.parameters.clone());
        Value::Object(o)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    Required,
    Named(String),
}

/// How the model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallFormat {
    /// `[{"name": ..., "arguments": {...}}]`, as Hearth's own tool prompt
    /// asks (templates that do not know tools).
    #[default]
    JsonArray,
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one
    /// per line, as templates in the Hermes style (Qwen 2.5...) ask.
    Tagged,
}

impl CallFormat {
    /// The character a call answer starts with (and a text answer may not).
    pub fn opener(self) -> char {
        match self {
            Self::JsonArray => '[',
            Self::Tagged => '<',
        }
    }
}

/// The most calls one answer may hold when parallel calls are allowed: a
/// bound on a small model that repeats its call instead of closing the
/// list (it would otherwise run to `max_tokens` and come back as text).
pub const MAX_PARALLEL_CALLS: usize = 16;

/// Tools a request offers, and how the model must use them.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTools {
    pub tools: Vec<ToolDef>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// Set once the model is known (its chat template says).
    pub format: CallFormat,
    /// Read from the deprecated `functions`: answered in their shape.
    pub legacy: bool,
}

/// A call in a response: `{id, type: "function", function: {name, arguments}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// `arguments` is a JSON text, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), message.into())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether a tool's `parameters` describe an object: `type` `object` (or
/// a list holding it), or no `type`.
fn object_schema(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    }
}

/// Where a tool's fields are: under `function` (chat completions) or
/// beside `type` (the Responses API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolShape {
    Chat,
    Flat,
}

impl ValidTools {
    /// Reads a chat completion's fields; `None` when no tool may be called
    /// (no tools, or `tool_choice: "none"`).
    pub fn parse(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, ApiError> {
        Self::parse_shaped(tools, choice, parallel, ToolShape::Chat)
    }

    /// Reads the fields in either shape.
    pub fn parse_shaped(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<bool>,
        shape: ToolShape,
    ) -> Result<Option<Self>, ApiError> {
        let list = match tools {
            None | Some(Value::Null) => Vec::new(),
            // Chat completions refuse an empty list, as OpenAI's do.
            Some(Value::Array(list)) if list.is_empty() && shape == ToolShape::Chat => {
                return Err(bad(
                    "tools",
                    "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.",
                ))
            }
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(bad("tools", "`tools` must be an array.")),
        };
        let mut defs = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            let param = format!("tools[{i}]");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(bad(
                        &format!("{param}.type"),
                        format!("Tools of type `{other}` are not supported: only `function` tools are (Hearth runs no hosted tools)."),
                    ))
                }
                None => {
                    return Err(bad(
                        &format!("{param}.type"),
                        "Each tool needs `type: \"function\"`.",
                    ))
                }
            }
            let (function, fparam) = match shape {
                ToolShape::Chat => (
                    tool.get("function")
                        .and_then(Value::as_object)
                        .ok_or_else(|| {
                            bad(
                                &format!("{param}.function"),
                                "A function tool needs `function`.",
                            )
                        })?,
                    format!("{param}.function"),
                ),
                ToolShape::Flat => (
                    tool.as_object()
                        .ok_or_else(|| bad(&param, "A tool must be an object."))?,
                    param.clone(),
                ),
            };
            let name = function.get("name").and_then(Value::as_str).unwrap_or("");
            if !valid_name(name) {
                return Err(bad(
                    &format!("{fparam}.name"),
                    "A function's name must be 1 to 64 letters, digits, `_` or `-`.",
                ));
            }
            if defs.iter().any(|d: &ToolDef| d.name == name) {
                return Err(bad(
                    &format!("{fparam}.name"),
                    format!("Two tools are named `{name}`."),
                ));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(Value::Object(p)) if object_schema(p) => Value::Object(p.clone()),
                Some(Value::Object(p)) => {
                    return Err(bad(
                        &format!("{fparam}.parameters"),
                        format!(
                            "Invalid schema for function '{name}': `parameters` must be a JSON schema of `type: \"object\"`, got `type: {}`.",
                            p.get("type").map(Value::to_string).unwrap_or_default()
                        ),
                    ))
                }
                Some(_) => {
                    return Err(bad(
                        &format!("{fparam}.parameters"),
                        "`parameters` must be a JSON schema object.",
                    ))
                }
            };
            defs.push(ToolDef {
                name: name.to_string(),
                description: function
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                parameters,
            });
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => return Ok(None),
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!("`tool_choice` must be `none`, `auto`, `required` or a function, not `{other}`."),
                    ))
                }
            },
            Some(Value::Object(o)) => {
                if o.get("type").and_then(Value::as_str) != Some("function") {
                    return Err(bad(
                        "tool_choice",
                        "`tool_choice` may only name a tool of type `function`.",
                    ));
                }
                let named = match shape {
                    ToolShape::Chat => o.get("function").and_then(|f| f.get("name")),
                    ToolShape::Flat => o.get("name"),
                };
                let name = named.and_then(Value::as_str).ok_or_else(|| {
                    bad(
                        "tool_choice",
                        match shape {
                            ToolShape::Chat => "`tool_choice` names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                            ToolShape::Flat => "`tool_choice` names a function as {\"type\": \"function\", \"name\": ...}.",
                        },
                    )
                })?;
                if !defs.iter().any(|d| d.name == name) {
                    return Err(bad(
                        "tool_choice",
                        format!("`tool_choice` names `{name}`, which is not among `tools`."),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
            Some(_) => return Err(bad("tool_choice", "`tool_choice` must be a string or an object.")),
        };
        if defs.is_empty() {
            return match choice {
                ToolChoice::Auto => Ok(None),
                _ => Err(bad(
                    "tool_choice",
                    "`tool_choice` needs at least one tool in `tools`.",
                )),
            };
        }
        Ok(Some(Self {
            tools: defs,
            choice,
            parallel: parallel.unwrap_or(true),
            format: CallFormat::JsonArray,
            legacy: false,
        }))
    }

    /// The tools the model may call now.
    fn callable(&self) -> impl Iterator<Item = &ToolDef> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Named(name) => &t.name == name,
            _ => true,
        })
    }

    /// The system message that tells the model about the tools.
    pub fn system_prompt(&self) -> String {
        let list: Vec<Value> = self.callable().map(ToolDef::described).collect();
        let format = "[{\"name\": \"<tool name>\", \"arguments\": {<the arguments>}}]";
        let how = match self.choice {
            ToolChoice::Auto => format!(
                "To call tools, answer with only a JSON array of calls, {format}; otherwise answer the user normally."
            ),
            _ => format!("Answer with only a JSON array of calls, {format}."),
        };
        format!(
            "You can call these tools (the JSON schema of each one's arguments is given):\n{}\n{how}",
            serde_json::to_string(&list).unwrap_or_default()
        )
    }

    /// The tools the model may call, as chat templates that know tools
    /// take them (`[{"type": "function", "function": {...}}]`).
    pub fn template_tools(&self) -> Value {
        self.callable()
            .map(|t| json!({"type": "function", "function": t.described()}))
            .collect()
    }

    /// The JSON schema of one call: `{"name": ..., "arguments": {...}}` of
    /// a callable tool.
    pub fn call_schema(&self) -> Value {
        let one: Vec<Value> = self
            .callable()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false
                })
            })
            .collect();
        if one.len() == 1 {
            one.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": one})
        }
    }

    /// How many calls one answer may hold: one when `parallel_tool_calls`
    /// is false or a function is named, else [`MAX_PARALLEL_CALLS`].
    pub fn max_calls(&self) -> usize {
        if self.parallel && !matches!(self.choice, ToolChoice::Named(_)) {
            MAX_PARALLEL_CALLS
        } else {
            1
        }
    }

    /// The JSON schema of what the model may answer with calls (as a JSON
    /// array of one to [`ValidTools::max_calls`] calls).
    pub fn calls_schema(&self) -> Value {
        let item = self.call_schema();
        json!({"type": "array", "items": item, "minItems": 1, "maxItems": self.max_calls()})
    }

    /// Whether the model may also answer without calling a tool.
    pub fn may_answer(&self) -> bool {
        self.choice == ToolChoice::Auto
    }

    /// The calls of an answer, when it is a call array of known tools
    /// (`new_id` makes each call's id). The answer must start with the
    /// opener itself: with `auto` the grammar constrains only answers whose
    /// first character is the opener, so one that starts otherwise (a
    /// blank, then something that looks like calls) is free text, as the
    /// stream shows it.
    pub fn calls_in(
        &self,
        text: &str,
        mut new_id: impl FnMut() -> String,
    ) -> Option<Vec<ToolCall>> {
        let text = text.trim_end();
        if !text.starts_with(self.format.opener()) {
            return None;
        }
        let calls: Vec<Value> = match self.format {
            CallFormat::JsonArray => serde_json::from_str(text).ok()?,
            CallFormat::Tagged => tagged_calls(text)?,
        };
        if calls.is_empty() {
            return None;
        }
        // A call repeated word for word (a small model's loop) once.
        let mut seen: Vec<&Value> = Vec::with_capacity(calls.len());
        calls
            .iter()
            .filter(|c| {
                let again = seen.contains(c);
                seen.push(c);
                !again
            })
            .map(|c| {
                let name = c.get("name")?.as_str()?;
                self.tools.iter().find(|t| t.name == name)?;
                let arguments = c.get("arguments").cloned().unwrap_or_else(|| json!({}));
                Some(ToolCall {
                    id: new_id(),
                    kind: "function".to_string(),
                    function: FunctionCall {
                        name: name.to_string(),
                        arguments: serde_json::to_string(&arguments).ok()?,
                    },
                })
            })
            .collect()
    }
}

/// The calls of `<tool_call>...</tool_call>` blocks, when the text is only
/// such blocks (and blanks between them).
fn tagged_calls(text: &str) -> Option<Vec<Value>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let body = rest.strip_prefix("<tool_call>")?;
        let end = body.find("</tool_call>")?;
        calls.push(serde_json::from_str(body[..end].trim()).ok()?);
        rest = body[end + "</tool_call>".len()..].trim_start();
    }
    Some(calls)
}

/// How an assistant message's earlier `tool_calls` are shown to the model:
/// in the format it is told to call with.
pub fn calls_as_text(tool_calls: &Value) -> String {
    calls_text(
        tool_calls
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (&c["function"]["name"], &c["function"]["arguments"])),
    )
}

/// Calls given as (name, arguments) pairs, where the arguments are a JSON
/// text (or already a value), in the format the model calls with.
pub fn calls_text<'a>(calls: impl Iterator<Item = (&'a Value, &'a Value)>) -> String {
    let calls: Vec<Value> = calls
        .map(|(name, arguments)| json!({"name": name, "arguments": arguments_value(arguments)}))
        .collect();
    serde_json::to_string(&calls).unwrap_or_default()
}

/// A message as chat templates that know tools take it: `role` (`tool`
/// when `is_tool`, with `tool_call_id`), `content`, and an assistant's
/// `tool_calls` (chat's shape, `arguments` turned into an object).
pub fn native_message(
    role: &str,
    is_tool: bool,
    content: &str,
    tool_calls: Option<&Value>,
    tool_call_id: Option<&str>,
) -> Value {
    if is_tool {
        return json!({"role": "tool", "content": content, "tool_call_id": tool_call_id});
    }
    let mut message = json!({"role": role, "content": content});
    if let Some(Value::Array(calls)) = tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                json!({"id": c["id"], "type": "function",
                       "function": {"name": f["name"], "arguments": arguments_value(&f["arguments"])}})
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// A call's `arguments` as a value: parsed when it is a JSON text (as
/// OpenAI sends it), else as given.
fn arguments_value(arguments: &Value) -> Value {
    arguments
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .unwrap_or_else(|| arguments.clone())
}

/// How a tool's result is shown to the model: as a user turn naming the
/// call, which every chat template accepts.
pub fn tool_result_text(call_id: &str, output: &str) -> String {
    format!("Result of the tool call {call_id}:\n{output}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time"}}])
    }

    #[test]
    fn tools_and_choices_parse() {
        let t = ValidTools::parse(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert_eq!(t.tools.len(), 2);
        assert!(
            ValidTools::parse(Some(&weather()), Some(&json!("none")), None)
                .unwrap()
                .is_none()
        );
        assert!(ValidTools::parse(None, None, None).unwrap().is_none());
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let t = ValidTools::parse(Some(&weather()), Some(&named), Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_time".into()));
        let schema = t.calls_schema();
        assert_eq!(schema["maxItems"], 1);
        // A named function is called once even with parallel calls allowed
        // (as vLLM's named choice); `required` allows up to the bound.
        let t = ValidTools::parse(Some(&weather()), Some(&named), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.calls_schema()["maxItems"], 1);
        let t = ValidTools::parse(Some(&weather()), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.calls_schema()["maxItems"], MAX_PARALLEL_CALLS);
        assert_eq!(t.calls_schema()["minItems"], 1);
        assert_eq!(schema["items"]["properties"]["name"]["const"], "get_time");
        for (tools, choice, param) in [
            (
                json!([{"type": "retrieval"}]),
                json!("auto"),
                "tools[0].type",
            ),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                json!("auto"),
                "tools[0].function.name",
            ),
            (
                weather(),
                json!({"type": "function", "function": {"name": "nope"}}),
                "tool_choice",
            ),
            (weather(), json!("always"), "tool_choice"),
            (json!([]), json!("required"), "tools"),
            (json!([]), json!("auto"), "tools"),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
                json!("auto"),
                "tools[0].function.parameters",
            ),
        ] {
            let e = ValidTools::parse(Some(&tools), Some(&choice), None).unwrap_err();
            assert_eq!(e.param(), Some(param), "{tools} {choice}");
        }
    }

    #[test]
    fn tagged_answers_become_calls() {
        let mut t = ValidTools::parse(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        t.format = CallFormat::Tagged;
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let calls = t.calls_in(text, String::new).unwrap();
        let names: Vec<_> = calls.iter().map(|c| c.function.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "get_time"]);
        assert_eq!(calls[0].function.arguments, r#"{"city":"Oslo"}"#);
        for bad in [
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n",
            "<tool_call>{}</tool_call> and some text",
            "[{\"name\": \"get_time\", \"arguments\": {}}]",
            "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        ] {
            assert!(t.calls_in(bad, String::new).is_none(), "{bad}");
        }
        let listed = t.template_tools();
        assert_eq!(listed[0]["function"]["name"], "get_weather");
        assert_eq!(listed[1]["type"], "function");
    }

    #[test]
    fn answers_become_calls() {
        let t = ValidTools::parse(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let mut n = 0;
        // Only an answer that starts with `[` is calls (with `auto`, text
        // after a leading blank is not held to the grammar: it is text, as
        // streamed).
        for free in [
            r#" [{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
            "\n[{\"name\": \"get_weather\", \"arguments\": {}}]",
        ] {
            assert!(t.calls_in(free, String::new).is_none(), "{free}");
        }
        let calls = t
            .calls_in(
                r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
                || {
                    n += 1;
                    format!("call_{n}")
                },
            )
            .unwrap();
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[0].id, "call_1");
        assert!(t.calls_in("It is sunny.", String::new).is_none());
        // A call repeated word for word comes back once; the same function
        // with other arguments is another call.
        let calls = t
            .calls_in(
                r#"[{"name": "get_weather", "arguments": {"city": "Paris"}},
                    {"name": "get_weather", "arguments": {"city": "Paris"}},
                    {"name": "get_weather", "arguments": {"city": "Oslo"}},
                    {"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
                String::new,
            )
            .unwrap();
        let args: Vec<_> = calls
            .iter()
            .map(|c| c.function.arguments.as_str())
            .collect();
        assert_eq!(args, [r#"{"city":"Paris"}"#, r#"{"city":"Oslo"}"#]);
        assert!(t
            .calls_in(r#"[{"name": "unknown", "arguments": {}}]"#, String::new)
            .is_none());
        let shown = calls_as_text(&json!([{"id": "c", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]));
        assert_eq!(
            shown,
            r#"[{"name":"get_weather","arguments":{"city":"Paris"}}]"#
        );
    }
}
