//! Chat fields OpenAI defines that Hearth cannot honour: refused with a 400
//! naming the field, as the Responses route does, rather than ignored (an
//! ignored `audio` or `web_search_options` would answer something other than
//! what the client asked for). Null, and the values that ask for nothing
//! (`modalities: ["text"]`, `verbosity: "medium"`), pass.

use serde_json::Value;

use crate::chat::ChatCompletionRequest;
use crate::error::ApiError;

fn refuse(param: &str, message: &str) -> ApiError {
    ApiError::bad_request(Some(param), message.to_string())
}

fn given(value: Option<&Value>) -> bool {
    value.is_some_and(|v| !v.is_null())
}

/// Checks the fields of `request` that ask for what no served model does.
pub(crate) fn check(request: &ChatCompletionRequest) -> Result<(), ApiError> {
    if given(request.audio.as_ref()) {
        return Err(refuse(
            "audio",
            "Audio output is not supported: the served models write text only.",
        ));
    }
    if let Some(modalities) = request.modalities.as_ref().filter(|v| !v.is_null()) {
        let ok = modalities
            .as_array()
            .is_some_and(|items| !items.is_empty() && items.iter().all(|m| m == "text"));
        if !ok {
            return Err(refuse(
                "modalities",
                "`modalities` may only be [\"text\"]: the served models write text only.",
            ));
        }
    }
    if given(request.web_search_options.as_ref()) {
        return Err(refuse(
            "web_search_options",
            "Web search is not supported: Hearth runs no hosted tools (give the model a function tool instead).",
        ));
    }
    if given(request.reasoning_effort.as_ref()) {
        return Err(refuse(
            "reasoning_effort",
            "`reasoning_effort` is not supported: the served models have no reasoning settings.",
        ));
    }
    if let Some(verbosity) = request.verbosity.as_ref().filter(|v| !v.is_null()) {
        if verbosity != "medium" {
            return Err(refuse(
                "verbosity",
                "`verbosity` is not supported: the served models have no verbosity setting (only `medium` is accepted).",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    fn param_of(extra: Value) -> Option<String> {
        check(&request(extra)).err().map(|e| {
            assert_eq!(e.status(), 400);
            e.body_json()["error"]["param"]
                .as_str()
                .unwrap()
                .to_string()
        })
    }

    #[test]
    fn fields_asking_for_what_no_model_does_are_refused_by_name() {
        for (extra, param) in [
            (
                json!({"audio": {"voice": "alloy", "format": "wav"}}),
                "audio",
            ),
            (json!({"modalities": ["text", "audio"]}), "modalities"),
            (json!({"modalities": "text"}), "modalities"),
            (json!({"modalities": []}), "modalities"),
            (json!({"web_search_options": {}}), "web_search_options"),
            (json!({"reasoning_effort": "low"}), "reasoning_effort"),
            (json!({"verbosity": "high"}), "verbosity"),
        ] {
            assert_eq!(param_of(extra.clone()).as_deref(), Some(param), "{extra}");
        }
    }

    #[test]
    fn null_and_values_asking_for_nothing_pass() {
        for extra in [
            json!({}),
            json!({"audio": null, "web_search_options": null, "reasoning_effort": null}),
            json!({"modalities": ["text"]}),
            json!({"modalities": null, "verbosity": null}),
            json!({"verbosity": "medium"}),
            json!({"prediction": {"type": "content", "content": "x"}, "store": false}),
        ] {
            assert_eq!(param_of(extra.clone()), None, "{extra}");
        }
    }
}
