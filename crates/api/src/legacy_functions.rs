//! OpenAI's deprecated function calling on chat completions: `functions`
//! (a list of `{name, description, parameters}`) and `function_call`
//! (`none`, `auto` or `{"name": ...}`), read as function `tools` and
//! `tool_choice` of one call; the answer comes back in the old shape
//! (`message.function_call`, `finish_reason` `function_call`).

use serde_json::{json, Value};

use crate::tools::ValidTools;
use crate::ApiError;

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), message.into())
}

/// An error about `tools` or `tool_choice` told about the legacy fields
/// they came from.
fn renamed(e: ApiError) -> ApiError {
    let Some(param) = e.param() else {
        return e;
    };
    let param = if let Some(rest) = param.strip_prefix("tools[") {
        format!("functions[{}", rest.replacen("].function", "]", 1))
    } else if param == "tools" {
        "functions".to_string()
    } else if param == "tool_choice" {
        "function_call".to_string()
    } else {
        return e;
    };
    bad(&param, e.message())
}

/// The tools of `functions` and `function_call`, when either is given
/// (`None` when neither is); both with `tools` or `tool_choice` is 400.
pub(crate) fn parse(
    functions: Option<&Value>,
    function_call: Option<&Value>,
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> Result<Option<Option<ValidTools>>, ApiError> {
    let given = |v: Option<&Value>| v.is_some_and(|v| !v.is_null());
    if !given(functions) && !given(function_call) {
        return Ok(None);
    }
    if given(tools) || given(tool_choice) {
        let param = if given(functions) {
            "functions"
        } else {
            "function_call"
        };
        return Err(bad(
            param,
            "Give `functions` and `function_call` (deprecated) or `tools` and `tool_choice`, not both.",
        ));
    }
    let list = match functions {
        Some(Value::Array(list)) => list,
        Some(v) if !v.is_null() => return Err(bad("functions", "`functions` must be an array.")),
        _ => return Err(bad("function_call", "`function_call` needs `functions`.")),
    };
    let tools: Vec<Value> = list
        .iter()
        .map(|f| json!({"type": "function", "function": f}))
        .collect();
    let choice = match function_call {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "none" || s == "auto" => Some(json!(s)),
        Some(Value::Object(o)) if o.get("name").is_some_and(Value::is_string) => {
            Some(json!({"type": "function", "function": {"name": o["name"]}}))
        }
        Some(_) => {
            return Err(bad(
                "function_call",
                "`function_call` must be `none`, `auto` or {\"name\": ...}.",
            ))
        }
    };
    let valid = ValidTools::parse(Some(&Value::Array(tools)), choice.as_ref(), Some(false))
        .map_err(renamed)?;
    Ok(Some(valid.map(|mut t| {
        t.legacy = true;
        t
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_become_tools_of_one_call() {
        let functions = json!([{"name": "f", "parameters": {"type": "object"}}, {"name": "g"}]);
        let t = parse(Some(&functions), Some(&json!({"name": "g"})), None, None)
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(t.legacy && !t.parallel);
        assert_eq!(t.choice, crate::tools::ToolChoice::Named("g".into()));
        assert!(parse(Some(&functions), Some(&json!("none")), None, None)
            .unwrap()
            .unwrap()
            .is_none());
        assert!(parse(None, None, None, None).unwrap().is_none());
        for (f, c, tools, param) in [
            (functions.clone(), Value::Null, json!([]), "functions"),
            (Value::Null, json!("auto"), Value::Null, "function_call"),
            (
                functions.clone(),
                json!({"name": "h"}),
                Value::Null,
                "function_call",
            ),
            (
                functions.clone(),
                json!("always"),
                Value::Null,
                "function_call",
            ),
            (
                json!([{"name": "a b"}]),
                Value::Null,
                Value::Null,
                "functions[0].name",
            ),
            (json!([]), Value::Null, Value::Null, "functions"),
        ] {
            let e = parse(Some(&f), Some(&c), Some(&tools), None).unwrap_err();
            assert_eq!(e.param(), Some(param), "{f} {c}");
        }
    }
}
