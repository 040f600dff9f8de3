//! Hostile and huge schemas with the real default model: each is served
//! with output that follows it, or refused with 4xx naming the field (also
//! when the grammar engine gives up mid-generation, whole or streamed);
//! never a 5xx, never output that breaks the schema, and a plain request
//! sent beside them still completes.

mod common;

use common::raw::Raw;
use common::*;
use serde_json::{json, Value};

async fn chat(body: &Value) -> Raw {
    common::raw::post_json(&with_model(), "/v1/chat/completions", body).await
}

fn with_schema(schema: Value) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    })
}

fn nested(depth: usize) -> Value {
    let mut schema = json!({"type": "string", "maxLength": 4});
    for _ in 0..depth {
        schema = json!({"type": "object", "properties": {"a": schema}, "required": ["a"],
                        "additionalProperties": false});
    }
    schema
}

/// Sends `body` beside a plain request; returns the hostile reply after
/// checking the plain one completed.
async fn beside_a_plain_request(body: Value) -> Raw {
    let plain = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": 8, "temperature": 0});
    let (hostile, plain) = tokio::join!(chat(&body), chat(&plain));
    plain.expect_status(200);
    let finish = plain.json()["choices"][0]["finish_reason"].clone();
    assert!(finish == "stop" || finish == "length", "{finish}");
    hostile
}

#[tokio::test]
async fn huge_enums_and_many_properties_are_served_within_the_schema() {
    let values: Vec<String> = (0..20_000).map(|i| format!("value_{i}")).collect();
    let reply = beside_a_plain_request(with_schema(json!({"type": "object",
        "properties": {"c": {"enum": values}}, "required": ["c"], "additionalProperties": false})))
    .await;
    reply.expect_status(200);
    let body = reply.json();
    let choice = &body["choices"][0];
    if choice["finish_reason"] == "stop" {
        let out: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap())
            .expect("stopped output parses");
        assert!(
            values.contains(&out["c"].as_str().unwrap().to_string()),
            "{out}"
        );
    }
    let names: Vec<String> = (0..2000).map(|i| format!("p{i}")).collect();
    // 2,000 properties of each kind, required; 500 optional integers.
    for (property, required) in [
        (json!({"type": "integer", "minimum": 0, "maximum": 9}), 2000),
        (json!({"type": "integer"}), 2000),
        (json!({"type": "number"}), 2000),
        (json!({"type": "boolean"}), 2000),
        (json!({"type": "integer"}), 0),
    ] {
        let count = if required == 0 { 500 } else { 2000 };
        let properties: serde_json::Map<String, Value> = names[..count]
            .iter()
            .map(|n| (n.clone(), property.clone()))
            .collect();
        let reply = beside_a_plain_request(with_schema(json!({"type": "object",
            "properties": properties, "required": names[..required]})))
        .await;
        assert_eq!(
            reply.status,
            200,
            "{property} x{count}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
        let text = reply.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let start = if required == 0 { "{" } else { "{\"p0\": " };
        assert!(text.starts_with(start), "{property}: {text}");
        let parsed = serde_json::from_str::<Value>(&text);
        if let Ok(Value::Object(o)) = parsed {
            assert!(o.keys().all(|k| names[..count].contains(k)), "{text}");
        }
    }
}

#[tokio::test]
async fn deep_nesting_is_served_or_refused_as_the_clients_mistake() {
    let reply = beside_a_plain_request(with_schema(nested(30))).await;
    reply.expect_status(200);
    let text = reply.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with(&"{\"a\": ".repeat(5)), "{text}");
    // Deeper than the body parser follows: 422 (a malformed body), not 5xx.
    let reply = beside_a_plain_request(with_schema(nested(300))).await;
    assert_eq!(
        reply.status,
        422,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
}

/// 12,000 alternatives: past the grammar engine's row limit, which it only
/// meets once the output has begun.
fn wide_any_of() -> Value {
    let options: Vec<Value> = (0..12_000)
        .map(|i| {
            json!({"type": "object", "properties": {format!("k{i}"): {"type": "string"}},
                        "required": [format!("k{i}")]})
        })
        .collect();
    json!({"anyOf": options})
}

#[tokio::test]
async fn a_grammar_the_engine_gives_up_on_is_a_400_naming_the_field() {
    // Refused when compiled or once the output has begun: 400 either way.
    let reply = beside_a_plain_request(with_schema(wide_any_of())).await;
    reply.expect_status(400);
    let error = &reply.json()["error"];
    assert_eq!(error["param"], "response_format", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("grammar engine") || message.contains("cannot be used"),
        "{error}"
    );
    assert!(!message.contains("<state>"), "{error}");
    // Streamed: a 400, or the error event, then [DONE]; no chunk claims to stop.
    let mut body = with_schema(wide_any_of());
    body["stream"] = json!(true);
    let reply = chat(&body).await;
    if reply.status != 400 {
        reply.expect_status(200);
        let text = String::from_utf8(reply.bytes.clone()).unwrap();
        let events = sse_events(&text);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(last["error"]["param"], "response_format", "{last}");
        assert!(!text.contains("\"finish_reason\":\"stop\""), "{text}");
    }
    // 3000 tools: their description alone is longer than the context.
    let tools: Vec<Value> = (0..3000)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("f{i}"),
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})
        })
        .collect();
    let reply = chat(&json!({"model": MODEL, "max_tokens": 20,
        "messages": [{"role": "user", "content": "Call one."}],
        "tools": tools, "tool_choice": "required"}))
    .await;
    reply.expect_status(400);
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("context"), "{message}");
}
