//! Validation rules: each out-of-range value answers 400 shape B naming its
//! `param`; valid requests become the engine's `SamplingParams`.

use hearth_api::{
    parse_json_body, ApiError, ChatCompletionRequest, CompletionRequest, PromptInput, ValidChat,
    ValidCompletion,
};
use serde_json::{json, Value};

fn completion(extra: Value) -> Result<ValidCompletion, ApiError> {
    let mut body = json!({"model": "m", "prompt": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    parse_json_body::<CompletionRequest>(body.to_string().as_bytes())
        .unwrap()
        .validate()
}

fn chat(extra: Value) -> Result<ValidChat, ApiError> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    parse_json_body::<ChatCompletionRequest>(body.to_string().as_bytes())
        .unwrap()
        .validate()
}

#[track_caller]
fn rejects<T: std::fmt::Debug>(result: Result<T, ApiError>, param: &str) {
    let err = result.unwrap_err();
    assert_eq!(err.status(), 400, "{err}");
    let body = err.body_json();
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["param"], param, "{body}");
}

#[test]
fn completion_defaults() {
    let v = completion(json!({})).unwrap();
    assert_eq!(v.prompts, vec![PromptInput::Text("hi".into())]);
    assert_eq!(v.params.max_tokens, Some(16));
    assert_eq!(v.params.temperature, 1.0);
    assert_eq!(
        (v.n, v.stream, v.include_usage, v.echo, v.logprobs),
        (1, false, false, false, None)
    );
}

#[test]
fn completion_full_request() {
    let v = completion(json!({
        "prompt": [[1, 2], [3]], "max_tokens": 5, "temperature": 0, "top_p": 0.5, "n": 2,
        "stream": true, "stream_options": {"include_usage": true}, "logprobs": 3,
        "stop": "\n", "presence_penalty": 1, "frequency_penalty": -1,
        "logit_bias": {"50256": -100}, "seed": 42, "suffix": "", "user": "u", "best_of": 2,
        "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": true
    }))
    .unwrap();
    assert_eq!(
        v.prompts,
        vec![
            PromptInput::Tokens(vec![1, 2]),
            PromptInput::Tokens(vec![3])
        ]
    );
    let p = &v.params;
    assert_eq!(
        (p.max_tokens, p.temperature, p.top_p, p.top_k),
        (Some(5), 0.0, 0.5, 0)
    );
    assert_eq!(
        (p.seed, p.logprobs, p.ignore_eos),
        (Some(42), Some(3), true)
    );
    assert_eq!(p.stop, vec!["\n".to_string()]);
    assert_eq!(p.logit_bias, vec![(50256, -100.0)]);
    assert_eq!(
        (v.n, v.stream, v.include_usage, v.logprobs),
        (2, true, true, Some(3))
    );
}

#[test]
fn stream_options_need_stream() {
    // As OpenAI and vLLM answer: a 400 naming it, not silently dropped.
    rejects(
        completion(json!({"stream_options": {"include_usage": true}})),
        "stream_options",
    );
    rejects(
        chat(json!({"stream": false, "stream_options": {}})),
        "stream_options",
    );
    let v = completion(json!({"stream": true, "stream_options": {"include_usage": true}})).unwrap();
    assert!(v.include_usage);
    // null is as if absent.
    assert!(!chat(json!({"stream_options": null})).unwrap().include_usage);
}

#[test]
fn logprobs_above_20() {
    rejects(completion(json!({"logprobs": 21})), "logprobs");
}

#[test]
fn logprobs_negative() {
    rejects(completion(json!({"logprobs": -1})), "logprobs");
}

#[test]
fn logprobs_with_echo() {
    rejects(completion(json!({"logprobs": 1, "echo": true})), "echo");
}

#[test]
fn temperature_range() {
    rejects(completion(json!({"temperature": 2.5})), "temperature");
    rejects(chat(json!({"temperature": -0.1})), "temperature");
}

#[test]
fn top_p_range() {
    rejects(completion(json!({"top_p": 0})), "top_p");
    rejects(chat(json!({"top_p": 1.01})), "top_p");
}

#[test]
fn n_range_states_limit() {
    // OpenAI's bound, 128 (the server's `--max-choices` bounds prompts x n).
    assert!(completion(json!({"n": 128})).is_ok());
    let err = completion(json!({"n": 129})).unwrap_err();
    assert!(err.message().contains("128"), "{err}");
    rejects(completion(json!({"n": 129})), "n");
    rejects(chat(json!({"n": 0})), "n");
}

#[test]
fn max_tokens_at_least_one() {
    rejects(completion(json!({"max_tokens": 0})), "max_tokens");
    rejects(chat(json!({"max_tokens": -3})), "max_tokens");
}

#[test]
fn penalties_range() {
    rejects(
        completion(json!({"presence_penalty": 2.1})),
        "presence_penalty",
    );
    rejects(
        chat(json!({"frequency_penalty": -2.1})),
        "frequency_penalty",
    );
}

#[test]
fn repetition_penalty_positive() {
    rejects(
        completion(json!({"repetition_penalty": 0})),
        "repetition_penalty",
    );
}

#[test]
fn min_p_range() {
    rejects(chat(json!({"min_p": 1.5})), "min_p");
}

#[test]
fn top_k_at_least_minus_one() {
    rejects(completion(json!({"top_k": -2})), "top_k");
    assert_eq!(chat(json!({"top_k": 0})).unwrap().params.top_k, 0);
    assert_eq!(chat(json!({"top_k": 40})).unwrap().params.top_k, 40);
}

#[test]
fn too_many_stop_strings() {
    rejects(
        completion(json!({"stop": ["a", "b", "c", "d", "e"]})),
        "stop",
    );
}

#[test]
fn empty_stop_string() {
    rejects(chat(json!({"stop": ["a", ""]})), "stop");
}

#[test]
fn logit_bias_key_not_integer() {
    rejects(completion(json!({"logit_bias": {"abc": 1}})), "logit_bias");
}

#[test]
fn logit_bias_value_range() {
    rejects(chat(json!({"logit_bias": {"5": 101}})), "logit_bias");
}

#[test]
fn empty_prompt_list() {
    rejects(completion(json!({"prompt": []})), "prompt");
    rejects(completion(json!({"prompt": [[]]})), "prompt");
}

#[test]
fn negative_token_id() {
    rejects(completion(json!({"prompt": [1, -5]})), "prompt");
}

#[test]
fn suffix_unsupported() {
    rejects(completion(json!({"suffix": "after"})), "suffix");
    assert!(completion(json!({"suffix": null})).is_ok());
    assert!(completion(json!({"suffix": ""})).is_ok());
}

#[test]
fn best_of_unsupported() {
    rejects(completion(json!({"best_of": 3})), "best_of");
    assert!(completion(json!({"best_of": 1})).is_ok());
}

#[test]
fn a_tool_message_names_its_call() {
    rejects(
        chat(
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}),
        ),
        "messages[1].tool_call_id",
    );
    let ok = chat(json!({"messages": [{"role": "user", "content": "a"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
        {"role": "tool", "tool_call_id": "call_1", "content": "c"},
        {"role": "user", "content": "d"}]}))
    .unwrap();
    assert_eq!(ok.messages[2].role, "user");
    assert!(ok.messages[2].content.contains("call_2"));
}

fn called(id: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
}

#[test]
fn tool_turns_answer_the_calls_before_them() {
    let user = json!({"role": "user", "content": "a"});
    let tool = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "r"});
    for (messages, param, says) in [
        // A tool message after no call.
        (
            json!([user, tool("call_1")]),
            "messages[1]",
            "must be a response",
        ),
        (
            json!([
                user,
                called("call_1"),
                tool("call_1"),
                tool("call_1"),
                user,
                tool("call_1")
            ]),
            "messages[5]",
            "must be a response",
        ),
        // An id the calls do not have.
        (
            json!([user, called("call_1"), tool("call_9")]),
            "messages[2]",
            "'call_9' not found",
        ),
        // Calls not answered before the next message, or at all.
        (
            json!([user, called("call_1"), user]),
            "messages[1]",
            "call_1",
        ),
        (
            json!([user, called("call_1")]),
            "messages[1]",
            "did not have response",
        ),
        (
            json!([user, {"role": "assistant", "tool_calls": [{"type": "function"}]}]),
            "messages[1].tool_calls[0].id",
            "id",
        ),
    ] {
        let err = chat(json!({ "messages": messages })).unwrap_err();
        let body = err.body_json();
        assert_eq!(err.status(), 400, "{messages}");
        assert_eq!(body["error"]["param"], param, "{messages}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
}

#[test]
fn empty_messages() {
    rejects(chat(json!({"messages": []})), "messages");
}

#[test]
fn unknown_role() {
    rejects(
        chat(
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}),
        ),
        "messages[1].role",
    );
}

#[test]
fn non_text_content_part() {
    let parts =
        json!([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]);
    rejects(
        chat(json!({"messages": [{"role": "user", "content": parts}]})),
        "messages[0].content[1].type",
    );
}

#[test]
fn null_user_content() {
    rejects(
        chat(json!({"messages": [{"role": "user", "content": null}]})),
        "messages[0].content",
    );
}

#[test]
fn developer_is_system() {
    let v = chat(json!({"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}]})).unwrap();
    assert_eq!(v.messages[0].role, "system");
}

#[test]
fn top_logprobs_range() {
    rejects(
        chat(json!({"logprobs": true, "top_logprobs": 21})),
        "top_logprobs",
    );
}

#[test]
fn top_logprobs_needs_logprobs() {
    rejects(chat(json!({"top_logprobs": 2})), "top_logprobs");
}

#[test]
fn chat_logprobs_mapping() {
    let v = chat(json!({"logprobs": true, "top_logprobs": 5})).unwrap();
    assert_eq!((v.logprobs, v.params.logprobs), (Some(5), Some(5)));
    let v = chat(json!({"logprobs": true})).unwrap();
    assert_eq!(v.logprobs, Some(0));
    let v = chat(json!({})).unwrap();
    assert_eq!((v.logprobs, v.params.max_tokens), (None, None));
}

#[test]
fn max_completion_tokens_overrides_max_tokens() {
    let v = chat(json!({"max_tokens": 10, "max_completion_tokens": 20})).unwrap();
    assert_eq!(v.params.max_tokens, Some(20));
    rejects(
        chat(json!({"max_completion_tokens": 0})),
        "max_completion_tokens",
    );
}

#[test]
fn tools_are_read() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let valid = chat(json!({"tools": tools})).unwrap();
    assert_eq!(valid.tools.unwrap().tools[0].name, "f");
    rejects(
        chat(json!({"tools": [{"type": "web_search"}]})),
        "tools[0].type",
    );
    // An empty list is refused, as OpenAI refuses it.
    rejects(chat(json!({"tools": []})), "tools");
    rejects(
        chat(
            json!({"tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "string"}}}]}),
        ),
        "tools[0].function.parameters",
    );
    assert!(chat(json!({"tools": tools, "tool_choice": "none"}))
        .unwrap()
        .tools
        .is_none());
}

#[test]
fn deprecated_functions_are_read_as_tools() {
    let functions = json!([{"name": "f", "parameters": {"type": "object"}}]);
    let valid = chat(json!({"functions": functions, "function_call": {"name": "f"}})).unwrap();
    let tools = valid.tools.unwrap();
    assert!(tools.legacy && !tools.parallel);
    assert_eq!(tools.tools[0].name, "f");
    assert!(
        chat(json!({"functions": functions, "function_call": "none"}))
            .unwrap()
            .tools
            .is_none()
    );
    rejects(
        chat(
            json!({"functions": functions, "tools": [{"type": "function", "function": {"name": "g"}}]}),
        ),
        "functions",
    );
    rejects(chat(json!({"function_call": "auto"})), "function_call");
    // A `function` message answers by name.
    let ok = chat(
        json!({"functions": functions, "messages": [{"role": "user", "content": "a"},
        {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "r"}]}),
    )
    .unwrap();
    assert!(
        ok.messages[1].content.contains("\"f\""),
        "{:?}",
        ok.messages
    );
    assert_eq!(ok.messages[2].role, "user");
    rejects(
        chat(json!({"messages": [{"role": "function", "content": "r"}]})),
        "messages[0].name",
    );
}

#[test]
fn tool_choice_and_response_format() {
    rejects(chat(json!({"tool_choice": "required"})), "tool_choice");
    assert!(chat(json!({"tool_choice": "none"})).is_ok());
    rejects(
        chat(json!({"response_format": {"type": "yaml"}})),
        "response_format",
    );
    let json_object = chat(json!({"response_format": {"type": "json_object"}})).unwrap();
    assert_eq!(
        json_object.format,
        hearth_api::output_format::OutputFormat::JsonObject
    );
    assert!(chat(json!({"response_format": {"type": "text"}})).is_ok());
}

#[test]
fn bad_request_detail_has_fixed_sentence() {
    let body = completion(json!({"logprobs": 25})).unwrap_err().body_json();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("Invalid request. Please check the parameters and try again. Details: ")
    );
    assert!(detail.contains("20"));
}
