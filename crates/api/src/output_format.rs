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
}

impl OutputFormat {
    /// The JSON schema the output must match (none for text).
    pub fn schema(&self) -> Option<Value> {
        match self {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(json!({"type": "object"})),
            OutputFormat::JsonSchema { schema, .. } => Some(schema.clone()),
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
                let schema = match spec.get("schema") {
                    Some(Value::Object(s)) => Value::Object(s.clone()),
                    Some(Value::Bool(true)) | None => json!({}),
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
