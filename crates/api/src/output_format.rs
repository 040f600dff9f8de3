//! Structured output requests: `response_format` of chat completions
//! (`{"type": "text" | "json_object" | "json_schema", "json_schema": {name,
//! schema, strict, description}}`), checked into an [`OutputFormat`].

use serde_json::{json, Value};

use crate::ApiError;

/// What the generated text must be.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum OutputFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `schema`.
    JsonSchema { name: String, schema: Value },
    /// Text matching a regular expression (`guided_regex`).
    Regex(String),
    /// Exactly one of these strings (`guided_choice`).
    Choice(Vec<String>),
    /// Text of a Lark grammar (`guided_grammar`).
    Grammar(String),
}

/// The vLLM-style `guided_*` extensions of chat and completion requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Guided<'a> {
    pub json: Option<&'a Value>,
    pub regex: Option<&'a str>,
    pub choice: Option<&'a [String]>,
    pub grammar: Option<&'a str>,
}

impl Guided<'_> {
    /// The format the fields ask for (none when none is given); more than
    /// one is 400.
    pub fn format(&self) -> Result<Option<OutputFormat>, ApiError> {
        let given: Vec<&str> = [
            ("guided_json", self.json.is_some_and(|v| !v.is_null())),
            ("guided_regex", self.regex.is_some()),
            ("guided_choice", self.choice.is_some()),
            ("guided_grammar", self.grammar.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name)
        .collect();
        if given.len() > 1 {
            return Err(ApiError::bad_request(
                Some(given[1]),
                format!("Give one of {} at a time.", given.join(", ")),
            ));
        }
        let bad =
            |param: &str, message: &str| ApiError::bad_request(Some(param), message.to_string());
        if let Some(json) = self.json.filter(|v| !v.is_null()) {
            return match json {
                Value::Object(_) => Ok(Some(OutputFormat::JsonSchema {
                    name: "guided_json".into(),
                    schema: json.clone(),
                })),
                _ => Err(bad(
                    "guided_json",
                    "`guided_json` must be a JSON schema object.",
                )),
            };
        }
        if let Some(regex) = self.regex {
            if regex.is_empty() {
                return Err(bad("guided_regex", "`guided_regex` must not be empty."));
            }
            return Ok(Some(OutputFormat::Regex(regex.to_string())));
        }
        if let Some(choice) = self.choice {
            if choice.is_empty() || choice.iter().any(String::is_empty) {
                return Err(bad(
                    "guided_choice",
                    "`guided_choice` must list one or more non-empty strings.",
                ));
            }
            return Ok(Some(OutputFormat::Choice(choice.to_vec())));
        }
        if let Some(grammar) = self.grammar {
            if grammar.trim().is_empty() {
                return Err(bad("guided_grammar", "`guided_grammar` must not be empty."));
            }
            return Ok(Some(OutputFormat::Grammar(grammar.to_string())));
        }
        Ok(None)
    }
}

/// The schema of any JSON object. `additionalProperties` is stated: the
/// grammar closes an object schema that does not say what else it allows.
pub fn any_object() -> Value {
    json!({"type": "object", "additionalProperties": true})
}

impl OutputFormat {
    /// The JSON schema the output must match (none for text and the
    /// non-JSON formats).
    pub fn schema(&self) -> Option<Value> {
        match self {
            OutputFormat::JsonObject => Some(any_object()),
            OutputFormat::JsonSchema { schema, .. } => Some(schema.clone()),
            _ => None,
        }
    }

    /// The `guided_*` field this format came from, if it did.
    pub fn guided_param(&self) -> Option<&'static str> {
        match self {
            OutputFormat::Regex(_) => Some("guided_regex"),
            OutputFormat::Choice(_) => Some("guided_choice"),
            OutputFormat::Grammar(_) => Some("guided_grammar"),
            OutputFormat::JsonSchema { name, .. } if name == "guided_json" => Some("guided_json"),
            _ => None,
        }
    }

    /// Reads `response_format` (`param` names it in errors).
    pub fn parse(value: Option<&Value>, param: &str) -> Result<Self, ApiError> {
        let bad = |message: String| ApiError::bad_request(Some(param), message);
        let object = match value {
            None | Some(Value::Null) => return Ok(OutputFormat::Text),
            Some(Value::Object(o)) => o,
            Some(_) => return Err(bad(format!("`{param}` must be an object with a `type`."))),
        };
        match object.get("type").and_then(Value::as_str) {
            Some("text") => Ok(OutputFormat::Text),
            Some("json_object") => Ok(OutputFormat::JsonObject),
            Some("json_schema") => {
                // Chat nests `name` and `schema` under `json_schema`; the
                // Responses API's `text.format` has them beside `type`.
                let flat = object.contains_key("schema") || object.contains_key("name");
                let spec = match object.get("json_schema").and_then(Value::as_object) {
                    Some(spec) => spec,
                    None if flat => object,
                    None => {
                        return Err(bad(format!(
                            "`{param}.json_schema` is required: {{\"name\": ..., \"schema\": {{...}}}}."
                        )))
                    }
                };
                let name = match spec.get("name") {
                    Some(Value::String(n))
                        if !n.is_empty()
                            && n.len() <= 64
                            && n.chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
                    {
                        n.clone()
                    }
                    _ => {
                        return Err(bad(format!(
                        "`{param}`: the schema's `name` must be 1 to 64 letters, digits, `_` or `-`."
                    )))
                    }
                };
                // Without a schema: any JSON object, as `json_object`.
                let schema = match spec.get("schema") {
                    Some(Value::Object(s)) => Value::Object(s.clone()),
                    None | Some(Value::Null) => any_object(),
                    Some(Value::Bool(true)) => json!({}),
                    Some(_) => {
                        return Err(bad(format!(
                            "`{param}`: `schema` must be a JSON schema object."
                        )))
                    }
                };
                Ok(OutputFormat::JsonSchema { name, schema })
            }
            Some(other) => Err(bad(format!(
                "`{param}.type` must be `text`, `json_object` or `json_schema`, not `{other}`."
            ))),
            None => Err(bad(format!("`{param}` needs a `type`."))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guided_fields_give_one_format() {
        let choice = vec!["yes".to_string(), "no".to_string()];
        let g = Guided {
            choice: Some(&choice),
            ..Default::default()
        };
        assert_eq!(
            g.format().unwrap(),
            Some(OutputFormat::Choice(choice.clone()))
        );
        assert_eq!(Guided::default().format().unwrap(), None);
        let two = Guided {
            choice: Some(&choice),
            regex: Some("a+"),
            ..Default::default()
        };
        assert_eq!(two.format().unwrap_err().status(), 400);
        let empty: Vec<String> = Vec::new();
        let e = Guided {
            choice: Some(&empty),
            ..Default::default()
        }
        .format()
        .unwrap_err();
        assert_eq!(e.param(), Some("guided_choice"));
    }

    #[test]
    fn formats_parse_and_refuse() {
        assert_eq!(OutputFormat::parse(None, "f").unwrap(), OutputFormat::Text);
        assert_eq!(
            OutputFormat::parse(Some(&json!({"type": "json_object"})), "f").unwrap(),
            OutputFormat::JsonObject
        );
        let s = OutputFormat::parse(
            Some(&json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": true}})),
            "f",
        )
        .unwrap();
        assert_eq!(s.schema(), Some(json!({"type": "object"})));
        // No schema: any object, as `json_object`.
        let s = OutputFormat::parse(
            Some(&json!({"type": "json_schema", "json_schema": {"name": "x"}})),
            "f",
        )
        .unwrap();
        assert_eq!(s.schema(), OutputFormat::JsonObject.schema());
        assert_eq!(s.schema(), Some(any_object()));
        for bad in [
            json!("json"),
            json!({"type": "xml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}),
        ] {
            let e = OutputFormat::parse(Some(&bad), "response_format").unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
            assert_eq!(e.param(), Some("response_format"), "{bad}");
        }
    }
}
