//! Every error shape of the API, through the in-process router.

mod common;

use common::*;
use hearth_server::AppState;
use serde_json::Value;

fn empty_state() -> AppState {
    bare_state()
}

fn assert_shape_a(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
    assert!(
        reply.content_type.starts_with("application/json"),
        "{}",
        reply.content_type
    );
    let body = reply.json();
    let obj = body.as_object().unwrap();
    assert_eq!(obj.len(), 1, "shape A has only `detail`: {body}");
    body["detail"]
        .as_str()
        .expect("detail is a string")
        .to_string()
}

fn assert_shape_b(reply: &Reply, status: u16, param: Option<&str>) -> Value {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
    let body = reply.json();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["code"].as_u64(), Some(status as u64), "{body}");
    assert_eq!(error["param"].as_str(), param, "{body}");
    assert!(body["detail"].is_string(), "{body}");
    body
}

fn assert_shape_c(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status.as_u16(), 422, "{}", reply.text);
    let body = reply.json();
    let items = body["detail"].as_array().expect("detail is a list").clone();
    assert!(!items.is_empty());
    for item in &items {
        assert!(
            item["type"].is_string() && item["loc"].is_array() && item["msg"].is_string(),
            "{item}"
        );
        assert!(item.get("input").is_some(), "{item}");
    }
    items
}

#[tokio::test]
async fn missing_key_is_401_saying_so() {
    let reply = send(&empty_state(), "GET", "/v1/models", None, None).await;
    let detail = assert_shape_a(&reply, 401);
    assert!(detail.contains("missing"), "{detail}");
}

#[tokio::test]
async fn wrong_key_is_401_saying_so() {
    let reply = send(&empty_state(), "GET", "/v1/models", Some("nope"), None).await;
    let detail = assert_shape_a(&reply, 401);
    assert!(detail.contains("Invalid API key"), "{detail}");
    let reply = send(
        &empty_state(),
        "POST",
        "/v1/chat/completions",
        Some("nope"),
        Some("{}"),
    )
    .await;
    assert_shape_a(&reply, 401);
}

#[tokio::test]
async fn health_needs_no_key() {
    let reply = send(&empty_state(), "GET", "/health", None, None).await;
    assert_eq!(reply.status.as_u16(), 200);
}

#[tokio::test]
async fn unknown_model_is_404() {
    let body = r#"{"model": "no/such-model", "messages": [{"role": "user", "content": "hi"}]}"#;
    let detail = assert_shape_a(
        &post(&empty_state(), "/v1/chat/completions", body).await,
        404,
    );
    assert!(detail.contains("no/such-model"), "{detail}");
    let body = r#"{"model": "no/such-model", "prompt": "hi"}"#;
    assert_shape_a(&post(&empty_state(), "/v1/completions", body).await, 404);
}

#[tokio::test]
async fn unknown_route_and_wrong_method_answer_json() {
    assert_shape_a(
        &send(&empty_state(), "GET", "/v1/nothing", Some(KEY), None).await,
        404,
    );
    assert_shape_a(
        &send(
            &empty_state(),
            "GET",
            "/v1/chat/completions",
            Some(KEY),
            None,
        )
        .await,
        405,
    );
}

#[tokio::test]
async fn malformed_json_is_422() {
    let items = assert_shape_c(&post(&empty_state(), "/v1/chat/completions", "{not json").await);
    assert_eq!(items[0]["type"], "json_invalid");
    let items = assert_shape_c(&post(&empty_state(), "/v1/completions", "").await);
    assert_eq!(items[0]["loc"][0], "body");
}

#[tokio::test]
async fn missing_field_is_422_with_its_location() {
    let items = assert_shape_c(
        &post(
            &empty_state(),
            "/v1/chat/completions",
            r#"{"messages": []}"#,
        )
        .await,
    );
    assert_eq!(items[0]["type"], "missing");
    assert_eq!(items[0]["loc"], serde_json::json!(["body", "model"]));
}

#[tokio::test]
async fn wrong_type_is_422() {
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#;
    let items = assert_shape_c(&post(&empty_state(), "/v1/chat/completions", body).await);
    assert_eq!(items[0]["loc"][0], "body");
    assert_eq!(items[0]["loc"][1], "messages");
    let body = r#"{"model": "m", "prompt": "x", "max_tokens": "many"}"#;
    assert_shape_c(&post(&empty_state(), "/v1/completions", body).await);
}

#[tokio::test]
async fn unparsable_query_value_is_422() {
    let reply = send(
        &empty_state(),
        "GET",
        "/v1/models?verbose=notabool",
        Some(KEY),
        None,
    )
    .await;
    let items = assert_shape_c(&reply);
    assert_eq!(items[0]["loc"], serde_json::json!(["query", "verbose"]));
    assert_eq!(items[0]["input"], "notabool");
}

#[tokio::test]
async fn logprobs_above_20_is_400_shape_b() {
    let body = r#"{"model": "m", "prompt": "hi", "logprobs": 21}"#;
    let body = assert_shape_b(
        &post(&empty_state(), "/v1/completions", body).await,
        400,
        Some("logprobs"),
    );
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .starts_with(hearth_api::INVALID_REQUEST_PREFIX));
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}"#;
    assert_shape_b(
        &post(&empty_state(), "/v1/chat/completions", body).await,
        400,
        Some("top_logprobs"),
    );
}

#[tokio::test]
async fn out_of_range_parameters_are_400() {
    let state = empty_state();
    for (field, value) in [
        ("temperature", "3"),
        ("top_p", "0"),
        ("n", "0"),
        ("max_tokens", "0"),
        ("presence_penalty", "5"),
        // Known OpenAI fields no served model honours: refused, not ignored.
        ("reasoning_effort", r#""low""#),
        ("audio", r#"{"voice": "alloy", "format": "mp3"}"#),
        ("modalities", r#"["text", "audio"]"#),
        ("web_search_options", "{}"),
    ] {
        let body = format!(
            r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "{field}": {value}}}"#
        );
        assert_shape_b(
            &post(&state, "/v1/chat/completions", &body).await,
            400,
            Some(field),
        );
    }
}

#[tokio::test]
async fn prompt_longer_than_the_context_is_400() {
    let state = with_model();
    let prompt = "hello ".repeat(9000);
    let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}).to_string();
    let body = assert_shape_b(
        &post(&state, "/v1/completions", &body).await,
        400,
        Some("prompt"),
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 8192 tokens"),
        "{body}"
    );
    // Named by the field the prompt came from, with or without `max_tokens`.
    let body =
        serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}]})
            .to_string();
    let reply = post(&state, "/v1/chat/completions", &body).await;
    assert_shape_b(&reply, 400, Some("messages"));
    let body =
        serde_json::json!({"model": MODEL, "input": prompt, "truncation": "disabled"}).to_string();
    assert_shape_b(
        &post(&state, "/v1/responses", &body).await,
        400,
        Some("input"),
    );
}

#[tokio::test]
async fn out_of_vocabulary_token_prompt_is_400() {
    let body =
        serde_json::json!({"model": MODEL, "prompt": [1, 2, 999999], "max_tokens": 1}).to_string();
    assert_shape_b(
        &post(&with_model(), "/v1/completions", &body).await,
        400,
        Some("prompt"),
    );
}

#[tokio::test]
async fn full_queue_is_529() {
    let state = with_tiny_queue();
    let long = serde_json::json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true}).to_string();
    // The first request runs, the second waits, the third finds the queue full.
    let s1 = state.clone();
    let l1 = long.clone();
    let first = tokio::spawn(async move { post(&s1, "/v1/completions", &l1).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let s2 = state.clone();
    let l2 = long.clone();
    let second = tokio::spawn(async move { post(&s2, "/v1/completions", &l2).await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let third = post(&state, "/v1/completions", &long).await;
    let body = assert_shape_b(&third, 529, None);
    assert_eq!(body["error"]["type"], "InternalServerError");
    first.abort();
    second.abort();
}
