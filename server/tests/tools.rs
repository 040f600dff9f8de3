//! Function calling on chat completions with the default model: `required`
//! and named `tool_choice` answer with calls of the offered functions whose
//! arguments match their schemas (whole and streamed), `auto` answers with
//! either valid calls or text, tool results go back to the model, and
//! malformed tools are refused naming the field.

mod common;

use common::raw::*;
use common::*;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather of a city.",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30},
                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "The time in a timezone.",
            "parameters": {"type": "object",
                "properties": {"timezone": {"type": "string", "maxLength": 30}},
                "required": ["timezone"], "additionalProperties": false}}}
    ])
}

async fn chat(body: Value) -> Raw {
    post_json(&with_model(), "/v1/chat/completions", &body).await
}

fn base(choice: Value) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(),
        "tool_choice": choice,
        "max_tokens": 120,
        "temperature": 0.7,
        "seed": 3,
    })
}

/// Checks one call against the offered tools; returns its name.
fn check_call(call: &Value) -> String {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {call}"));
    match name.as_str() {
        "get_weather" => {
            assert!(args["city"].is_string(), "{call}");
            assert!(
                ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
                "{call}"
            );
            assert_eq!(args.as_object().unwrap().len(), 2, "{call}");
        }
        "get_time" => assert!(args["timezone"].is_string(), "{call}"),
        other => panic!("a call of an unknown tool `{other}`"),
    }
    name
}

#[tokio::test]
async fn required_and_named_choices_answer_with_valid_calls() {
    let reply = chat(base(json!("required"))).await;
    reply.expect_status(200);
    let body = reply.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert!(choice["message"]["content"].is_null(), "{body}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty());
    calls.iter().for_each(|c| {
        check_call(c);
    });

    let mut named = base(json!({"type": "function", "function": {"name": "get_time"}}));
    named["parallel_tool_calls"] = json!(false);
    named["n"] = json!(2);
    let body = chat(named).await.json();
    for choice in body["choices"].as_array().unwrap() {
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{choice}");
        assert_eq!(check_call(&calls[0]), "get_time");
    }
}

#[tokio::test]
async fn arguments_have_only_the_listed_properties() {
    // No `parameters`, or no properties: the arguments are `{}`.
    for parameters in [None, Some(json!({"type": "object", "properties": {}}))] {
        let mut function = json!({"name": "get_time", "description": "The current time."});
        if let Some(p) = parameters {
            function["parameters"] = p;
        }
        let mut body = base(json!("required"));
        body["tools"] = json!([{"type": "function", "function": function}]);
        body["parallel_tool_calls"] = json!(false);
        body["max_tokens"] = json!(40);
        let body = chat(body).await.json();
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        for call in choice["message"]["tool_calls"].as_array().unwrap() {
            assert_eq!(call["function"]["arguments"], "{}", "{body}");
        }
    }
    // Without `additionalProperties`: no keys beyond `city` and `unit`.
    let mut tools = tools();
    tools[0]["function"]["parameters"]
        .as_object_mut()
        .unwrap()
        .remove("additionalProperties");
    tools[0]["function"]["parameters"]["required"] = json!(["city"]);
    for seed in 0..3 {
        let mut body = base(json!({"type": "function", "function": {"name": "get_weather"}}));
        body["tools"] = tools.clone();
        body["seed"] = json!(seed);
        let body = chat(body).await.json();
        let choice = &body["choices"][0];
        if choice["finish_reason"] != "tool_calls" {
            continue;
        }
        let call = &choice["message"]["tool_calls"][0];
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        for key in args.as_object().unwrap().keys() {
            assert!(key == "city" || key == "unit", "{call}");
        }
    }
}

#[tokio::test]
async fn deprecated_functions_answer_in_their_own_shape() {
    let functions: Vec<Value> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"].clone())
        .collect();
    let mut body = base(Value::Null);
    body.as_object_mut().unwrap().remove("tools");
    body.as_object_mut().unwrap().remove("tool_choice");
    body["functions"] = json!(functions);
    body["function_call"] = json!({"name": "get_weather"});
    let reply = chat(body.clone()).await;
    reply.expect_status(200);
    let whole = reply.json();
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "function_call", "{whole}");
    assert!(choice["message"]["content"].is_null(), "{whole}");
    assert!(choice["message"].get("tool_calls").is_none(), "{whole}");
    let call = &choice["message"]["function_call"];
    check_call(&json!({"id": "call_x", "type": "function", "function": call}));

    // Streamed: the call whole in `delta.function_call`, then its finish.
    body["stream"] = json!(true);
    let reply = chat(body.clone()).await;
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    let chunks = sse_json(&text);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("function_call"))
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["name"], "get_weather", "{text}");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "function_call"));

    // The result goes back as a `function` message.
    body["stream"] = json!(false);
    body["function_call"] = json!("auto");
    body["messages"] = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "21 degrees, clear sky"}]);
    chat(body.clone()).await.expect_status(200);
    // Not with `tools`.
    body["tools"] = tools();
    let reply = chat(body).await;
    reply.expect_status(400);
    assert_eq!(reply.json()["error"]["param"], "functions");
}

#[tokio::test]
async fn streamed_calls_come_whole_with_their_index() {
    let mut body = base(json!("required"));
    body["stream"] = json!(true);
    let reply = chat(body).await;
    reply.expect_status(200);
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    let mut calls = Vec::new();
    let mut finish = None;
    for chunk in sse_json(&text) {
        let choice = &chunk["choices"][0];
        // A choice of calls carries no content, as whole it has `content: null`.
        assert!(choice["delta"]["content"].is_null(), "{chunk}");
        if let Some(list) = choice["delta"]["tool_calls"].as_array() {
            for (i, c) in list.iter().enumerate() {
                assert_eq!(c["index"], i);
                calls.push(c.clone());
            }
        }
        if !choice["finish_reason"].is_null() {
            finish = Some(choice["finish_reason"].clone());
        }
    }
    assert_eq!(finish, Some(json!("tool_calls")));
    assert!(!calls.is_empty());
    calls.iter().for_each(|c| {
        check_call(c);
    });
}

#[tokio::test]
async fn auto_answers_with_calls_or_text_and_results_go_back() {
    for seed in 0..3 {
        let mut body = base(json!("auto"));
        body["seed"] = json!(seed);
        let body = chat(body).await.json();
        let choice = &body["choices"][0];
        if choice["finish_reason"] == "tool_calls" {
            choice["message"]["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .for_each(|c| {
                    check_call(c);
                });
        } else {
            let text = choice["message"]["content"].as_str().unwrap();
            assert!(!text.trim_start().starts_with('['), "{text}");
            assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
        }
    }
    // The conversation continues with the tool's result.
    let reply = chat(json!({
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
        ],
        "tools": tools(),
        "tool_choice": "none",
        "max_tokens": 40,
        "temperature": 0,
    }))
    .await;
    reply.expect_status(200);
    let body = reply.json();
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    assert!(!body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn malformed_tools_are_refused_by_name() {
    for (tools, choice, extra, param) in [
        (
            json!([{"type": "code_interpreter"}]),
            json!("auto"),
            json!({}),
            "tools[0].type",
        ),
        (
            tools(),
            json!({"type": "function", "function": {"name": "nope"}}),
            json!({}),
            "tool_choice",
        ),
        (tools(), json!("always"), json!({}), "tool_choice"),
        (
            tools(),
            json!("auto"),
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ] {
        let mut body = base(choice);
        body["tools"] = tools;
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = chat(body.clone()).await;
        reply.expect_status(400);
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
}

#[tokio::test]
async fn auto_streams_a_text_answer_as_it_comes() {
    let mut body = base(json!("auto"));
    body["messages"] = json!([{"role": "user", "content": "Say hi."}]);
    body["temperature"] = json!(0);
    body["stream"] = json!(true);
    let reply = chat(body).await;
    reply.expect_status(200);
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    let mut pieces = Vec::new();
    let mut finish = None;
    for chunk in sse_json(&text) {
        let choice = &chunk["choices"][0];
        assert!(choice["delta"].get("tool_calls").is_none(), "{chunk}");
        if let Some(piece) = choice["delta"]["content"].as_str() {
            pieces.push(piece.to_string());
        }
        if !choice["finish_reason"].is_null() {
            finish = Some(choice["finish_reason"].clone());
        }
    }
    // Text answers stream token by token, not as one piece at the end.
    assert!(pieces.len() > 2, "{pieces:?}");
    assert!(!pieces.concat().starts_with('['));
    assert_eq!(finish, Some(json!("stop")));
}

/// The loop a small model falls into when a call is forced: it repeats
/// the call instead of closing the list. A named function is called once
/// (the grammar allows one call), and under `required` the list is bounded
/// and a call repeated word for word comes back once: either way calls
/// with `tool_calls`, not the list cut off by `max_tokens` as text.
#[tokio::test]
async fn a_forced_call_is_not_repeated_to_the_token_limit() {
    let add = json!([{"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}]);
    for choice in [
        json!({"type": "function", "function": {"name": "add"}}),
        json!("required"),
    ] {
        let reply = chat(json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            "tools": add, "tool_choice": choice,
            "max_tokens": 400, "temperature": 0,
        }))
        .await;
        reply.expect_status(200);
        let body = reply.json();
        let choice0 = &body["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{choice}: {body}");
        let calls = choice0["message"]["tool_calls"].as_array().unwrap();
        let args: Vec<&str> = calls
            .iter()
            .map(|c| c["function"]["arguments"].as_str().unwrap())
            .collect();
        let mut distinct = args.clone();
        distinct.dedup();
        assert_eq!(args, distinct, "a call repeated: {body}");
        assert!(choice0["message"]["content"].is_null(), "{body}");
    }
}
