//! Function tools on `/v1/responses` with the real default model:
//! `function_call` output items (whole and as streamed events) whose
//! arguments follow the tool's schema, `function_call_output` input items
//! continuing the conversation (by `previous_response_id` or with the calls
//! given inline), the input items listed back, and bad items refused by
//! name.

mod common;

use common::raw::Raw;
use common::*;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "strict": true,
         "description": "The current weather of a city.",
         "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}},
        {"type": "function", "name": "get_time",
         "description": "The time in a timezone.",
         "parameters": {"type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 30}},
            "required": ["timezone"], "additionalProperties": false}}
    ])
}

async fn respond(body: &Value) -> Raw {
    common::raw::post_json(&with_model(), "/v1/responses", body).await
}

async fn get(uri: &str) -> Value {
    let reply = common::raw::request(&with_model(), "GET", uri, Some(KEY), None, Vec::new()).await;
    reply.expect_status(200);
    reply.json()
}

fn ask(choice: Value) -> Value {
    json!({
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "tools": tools(),
        "tool_choice": choice,
        "max_output_tokens": 120,
        "temperature": 0.7,
    })
}

/// Checks a `function_call` item against the offered tools.
fn check_call(item: &Value) {
    assert_eq!(item["type"], "function_call", "{item}");
    assert!(item["id"].as_str().unwrap().starts_with("fc_"), "{item}");
    assert!(
        item["call_id"].as_str().unwrap().starts_with("call_"),
        "{item}"
    );
    assert_eq!(item["status"], "completed", "{item}");
    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {item}"));
    match item["name"].as_str().unwrap() {
        "get_weather" => {
            assert!(args["city"].is_string(), "{item}");
            assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()));
            assert_eq!(args.as_object().unwrap().len(), 2, "{item}");
        }
        "get_time" => assert!(args["timezone"].is_string(), "{item}"),
        other => panic!("a call of an unknown tool `{other}`"),
    }
}

#[tokio::test]
async fn a_named_tool_is_called_and_its_result_continues_the_response() {
    let choice = json!({"type": "function", "name": "get_weather"});
    let mut body = ask(choice.clone());
    // Greedy, as the streamed test below: at 0.7 the small model now and
    // then repeats calls until the token budget (an incomplete response).
    body["temperature"] = json!(0);
    let reply = respond(&body).await;
    reply.expect_status(200);
    let first = reply.json();
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["tool_choice"], choice);
    assert_eq!(first["tools"], tools());
    let output = first["output"].as_array().unwrap();
    assert!(!output.is_empty());
    output.iter().for_each(check_call);
    assert!(output.iter().all(|c| c["name"] == "get_weather"));
    let call_id = output[0]["call_id"].as_str().unwrap();

    // A new message without the calls' results is refused.
    let skipped = respond(&json!({"model": MODEL, "previous_response_id": first["id"],
        "input": "never mind", "tools": tools()}))
    .await;
    skipped.expect_status(400);
    let error = skipped.json()["error"].clone();
    assert_eq!(error["param"], "input", "{error}");
    assert_eq!(
        error["message"],
        format!("No tool output found for function call {call_id}.")
    );

    // The tool's result, by `previous_response_id`.
    let second = respond(&json!({
        "model": MODEL,
        "previous_response_id": first["id"],
        "input": [{"type": "function_call_output", "call_id": call_id,
                   "output": "{\"temperature\": 21, \"sky\": \"clear\"}"}],
        "tools": tools(),
        "tool_choice": "none",
        "max_output_tokens": 40,
        "temperature": 0,
    }))
    .await;
    second.expect_status(200);
    let second = second.json();
    assert_eq!(second["output"][0]["type"], "message", "{second}");
    let text = second["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty());
    let items = get(&format!(
        "/v1/responses/{}/input_items",
        second["id"].as_str().unwrap()
    ))
    .await;
    let item = &items["data"][0];
    assert_eq!(item["type"], "function_call_output", "{items}");
    assert_eq!(item["call_id"], call_id);
    assert!(item["id"].as_str().unwrap().starts_with("fco_"));
    // The stored first response keeps its calls.
    let stored = get(&format!("/v1/responses/{}", first["id"].as_str().unwrap())).await;
    assert_eq!(stored, first);
}

#[tokio::test]
async fn calls_given_inline_are_listed_and_an_output_needs_its_call() {
    let input = json!([
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"type": "function_call", "call_id": "call_7", "name": "get_weather",
         "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"},
        {"type": "function_call_output", "call_id": "call_7", "output": "-3 degrees and snow"}
    ]);
    let reply = respond(&json!({"model": MODEL, "input": input, "tools": tools(),
        "max_output_tokens": 30, "temperature": 0}))
    .await;
    reply.expect_status(200);
    let r = reply.json();
    let items = get(&format!(
        "/v1/responses/{}/input_items?order=asc",
        r["id"].as_str().unwrap()
    ))
    .await;
    let kinds: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
    assert_eq!(items["data"][1]["name"], "get_weather");
    assert_eq!(items["data"][2]["output"], "-3 degrees and snow");

    // A call whose output does not come before the next message.
    let reply = respond(&json!({"model": MODEL, "tools": tools(), "input": [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather",
         "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"},
        {"role": "user", "content": "never mind"}]}))
    .await;
    reply.expect_status(400);
    let error = reply.json()["error"].clone();
    assert_eq!(error["param"], "input", "{error}");
    assert_eq!(
        error["message"],
        "No tool output found for function call call_abc."
    );

    // An output whose call is nowhere before it.
    let reply = respond(&json!({"model": MODEL, "tools": tools(), "input": [
        {"type": "function_call_output", "call_id": "call_missing", "output": "x"}]}))
    .await;
    reply.expect_status(400);
    assert_eq!(reply.json()["error"]["param"], "input[0].call_id");
    for (body, param) in [
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "name": "f", "parameters": 3}]}),
            "tools[0].parameters",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "name": "nope"}}),
            "tool_choice",
        ),
        (
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}),
            "input[0].arguments",
        ),
    ] {
        let mut request = json!({"model": MODEL, "input": "hi"});
        for (k, v) in body.as_object().unwrap() {
            request[k] = v.clone();
        }
        let reply = respond(&request).await;
        reply.expect_status(400);
        assert_eq!(reply.json()["error"]["param"], param, "{request}");
    }
}

/// The stream's events, checked for order of `sequence_number`.
fn events_of(reply: &Raw) -> Vec<Value> {
    reply.expect_status(200);
    let events = sse_json(&String::from_utf8(reply.bytes.clone()).unwrap());
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    events
}

#[tokio::test]
async fn streamed_calls_send_argument_events_per_item() {
    let mut body = ask(json!("required"));
    body["stream"] = json!(true);
    // Greedy: at 0.7 the small model now and then repeats calls until the
    // token budget ends the response (incomplete), a draw of its own.
    body["temperature"] = json!(0);
    let events = events_of(&respond(&body).await);
    let done = events.last().unwrap();
    assert_eq!(done["type"], "response.completed", "{done}");
    let output = done["response"]["output"].as_array().unwrap();
    assert!(!output.is_empty());
    output.iter().for_each(check_call);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let mut expected = vec!["response.created", "response.in_progress"];
    for _ in output {
        expected.extend([
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]);
    }
    expected.push("response.completed");
    assert_eq!(kinds, expected);
    for (index, item) in output.iter().enumerate() {
        let of_item: Vec<&Value> = events
            .iter()
            .filter(|e| e["output_index"] == index && e["type"] != "response.created")
            .collect();
        assert_eq!(of_item[0]["item"]["status"], "in_progress");
        assert_eq!(of_item[0]["item"]["arguments"], "");
        assert_eq!(of_item[1]["item_id"], item["id"]);
        assert_eq!(of_item[1]["delta"], item["arguments"]);
        assert_eq!(of_item[2]["arguments"], item["arguments"]);
        assert_eq!(&of_item[3]["item"], item);
    }
}

#[tokio::test]
async fn auto_streams_text_or_calls_consistently() {
    for temperature in [0.0, 1.0] {
        let mut body = ask(json!("auto"));
        body["stream"] = json!(true);
        body["temperature"] = json!(temperature);
        let events = events_of(&respond(&body).await);
        let done = &events.last().unwrap()["response"];
        let output = done["output"].as_array().unwrap();
        if output[0]["type"] == "function_call" {
            output.iter().for_each(check_call);
        } else {
            assert_eq!(output.len(), 1);
            let joined: String = events
                .iter()
                .filter(|e| e["type"] == "response.output_text.delta")
                .map(|e| e["delta"].as_str().unwrap())
                .collect();
            let text = output[0]["content"][0]["text"].as_str().unwrap();
            assert_eq!(joined, text);
            assert!(!text.starts_with('['), "{text}");
        }
    }
}
