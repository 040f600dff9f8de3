//! Structured output on chat completions with the default model: with
//! `response_format` `json_schema` every choice (sampled, `n` = 2, streamed
//! or not) is JSON that matches the schema; `json_object` gives an object;
//! a schema that cannot be compiled is 400 naming `response_format`.

mod common;

use common::raw::*;
use common::*;
use serde_json::{json, Value};

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "likes": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "likes"],
        "additionalProperties": false
    })
}

async fn chat(body: Value) -> Raw {
    post_json(&with_model(), "/v1/chat/completions", &body).await
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<_> = o.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["age", "likes", "name"], "{text}");
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 20),
        "{text}"
    );
    assert!(
        o["age"].as_i64().is_some_and(|a| (0..=130).contains(&a)),
        "{text}"
    );
    let likes = o["likes"].as_array().unwrap();
    assert!(
        likes.len() <= 3 && likes.iter().all(Value::is_string),
        "{text}"
    );
}

#[tokio::test]
async fn json_schema_choices_match_the_schema() {
    let reply = chat(json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}},
        "n": 2,
        "temperature": 0.9,
        "seed": 7,
        "max_tokens": 200,
        "logprobs": true,
    }))
    .await;
    reply.expect_status(200);
    let body = reply.json();
    for choice in body["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "stop", "{choice}");
        check_person(choice["message"]["content"].as_str().unwrap());
        // Log-probabilities are of the masked distribution: finite, <= 0.
        for lp in choice["logprobs"]["content"].as_array().unwrap() {
            let v = lp["logprob"].as_f64().unwrap();
            assert!(v.is_finite() && v <= 1e-6, "{lp}");
        }
    }
}

#[tokio::test]
async fn streamed_json_schema_output_matches_too() {
    let reply = chat(json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Who are you? Answer in JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema()}},
        "stream": true,
        "temperature": 0.7,
        "max_tokens": 200,
    }))
    .await;
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    let mut content = String::new();
    for event in sse_events(&text) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(piece);
        }
    }
    check_person(&content);
}

#[tokio::test]
async fn json_object_gives_an_object_and_bad_formats_are_refused() {
    // `json_schema` without `schema` is any object too.
    for format in [
        json!({"type": "json_object"}),
        json!({"type": "json_schema", "json_schema": {"name": "x"}}),
    ] {
        let reply = chat(json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "List two colours in JSON."}],
            "response_format": format,
            "max_tokens": 120,
            "temperature": 0,
        }))
        .await;
        assert_eq!(reply.status, 200);
        let body = reply.json();
        let content = body["choices"][0]["message"]["content"].as_str().unwrap();
        if body["choices"][0]["finish_reason"] == "stop" {
            let v: Value =
                serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
            assert!(v.is_object(), "{format}: {content}");
        } else {
            assert!(content.trim_start().starts_with('{'), "{content}");
        }
    }
    for format in [
        json!({"type": "xml"}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
    ] {
        let reply = chat(json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": format,
        }))
        .await;
        assert_eq!(
            reply.status,
            400,
            "{format}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
        let error = &reply.json()["error"];
        assert_eq!(error["param"], "response_format", "{format}");
        // The reason, without the grammar engine's state.
        let message = error["message"].as_str().unwrap();
        assert!(
            !message.contains('\n') && !message.contains("<state>"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn responses_text_format_json_schema_is_followed_and_echoed() {
    let state = with_model();
    let format =
        json!({"type": "json_schema", "name": "person", "schema": person_schema(), "strict": true});
    let reply = request(
        &state,
        "POST",
        "/v1/responses",
        Some(KEY),
        Some("application/json"),
        json!({
            "model": MODEL,
            "input": "Describe a person.",
            "text": {"format": format},
            "max_output_tokens": 200,
            "store": false,
        })
        .to_string()
        .into_bytes(),
    )
    .await;
    reply.expect_status(200);
    let body = reply.json();
    assert_eq!(body["status"], "completed", "{body}");
    assert_eq!(body["text"]["format"], format);
    check_person(body["output"][0]["content"][0]["text"].as_str().unwrap());
}
