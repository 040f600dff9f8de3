//! Behaviour of the generation API with the real default model, in-process.

mod common;

use common::*;
use serde_json::{json, Value};

async fn complete(body: Value) -> Value {
    let reply = post(&with_model(), "/v1/completions", &body.to_string()).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text);
    reply.json()
}

async fn chat(body: Value) -> Value {
    let reply = post(&with_model(), "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text);
    reply.json()
}

fn user(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

#[tokio::test]
async fn models_lists_the_default_model_and_verbose_details() {
    let state = with_model();
    let body = send(&state, "GET", "/v1/models", Some(KEY), None)
        .await
        .json();
    assert_eq!(body["object"], "list");
    let model = &body["data"][0];
    assert_eq!(model["id"], MODEL);
    assert_eq!(model["object"], "model");
    assert!(model["created"].is_u64() && model["owned_by"].is_string());
    assert!(model.get("context_length").is_none());
    let uri = format!(
        "/v1/models?verbose=true&ai_project_id={}",
        state.default_project
    );
    let body = send(&state, "GET", &uri, Some(KEY), None).await.json();
    assert_eq!(body["data"][0]["kind"], "chat");
    assert_eq!(body["data"][0]["context_length"], 8192);
}

#[tokio::test]
async fn a_model_is_retrieved_by_its_id_slash_and_all() {
    let state = with_model();
    let listed = send(&state, "GET", "/v1/models", Some(KEY), None)
        .await
        .json();
    assert!(
        MODEL.contains('/'),
        "the test wants an id with a slash: {MODEL}"
    );
    let escaped = MODEL.replace('/', "%2F");
    for path in [
        format!("/v1/models/{MODEL}"),
        format!("/v1/models/{escaped}"),
    ] {
        let reply = send(&state, "GET", &path, Some(KEY), None).await;
        assert_eq!(reply.status.as_u16(), 200, "{path}: {}", reply.text);
        assert_eq!(reply.json(), listed["data"][0], "{path}");
    }
    let uri = format!("/v1/models/{MODEL}?verbose=true");
    let verbose = send(&state, "GET", &uri, Some(KEY), None).await.json();
    assert_eq!(
        (verbose["kind"].clone(), verbose["context_length"].clone()),
        (json!("chat"), json!(8192))
    );
    for unknown in [
        "/v1/models/nope",
        "/v1/models/HuggingFaceTB",
        "/v1/models/a/b/c",
    ] {
        let reply = send(&state, "GET", unknown, Some(KEY), None).await;
        assert_eq!(reply.status.as_u16(), 404, "{unknown}: {}", reply.text);
        assert!(reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist"));
    }
    let reply = send(&state, "GET", &format!("/v1/models/{MODEL}"), None, None).await;
    assert_eq!(reply.status.as_u16(), 401, "{}", reply.text);
}

#[tokio::test]
async fn the_capital_of_france_is_paris() {
    let body = complete(json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(body["object"], "text_completion");
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(body["usage"]["total_tokens"], 9);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    for field in ["id", "created", "model", "service_tier"] {
        assert!(!body[field].is_null(), "missing {field}: {body}");
    }
}

#[tokio::test]
async fn chat_answers_with_every_field() {
    let body = chat(json!({"model": MODEL, "messages": user("List three primary colors."), "temperature": 0, "max_tokens": 24})).await;
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().unwrap();
    let lower = content.to_lowercase();
    let colours = ["red", "blue", "yellow"]
        .iter()
        .filter(|c| lower.contains(*c))
        .count();
    assert!(colours >= 2, "{content:?}");
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["service_tier"], "default");
    assert!(body["created"].is_u64());
}

#[tokio::test]
async fn chat_content_parts_equal_plain_content() {
    let plain = chat(
        json!({"model": MODEL, "messages": user("Say hi"), "temperature": 0, "max_tokens": 8}),
    )
    .await;
    let parts = chat(json!({"model": MODEL, "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]}))
    .await;
    assert_eq!(
        plain["choices"][0]["message"],
        parts["choices"][0]["message"]
    );
}

#[tokio::test]
async fn stop_strings_end_generation_and_are_not_returned() {
    let free = complete(
        json!({"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0}),
    )
    .await;
    let free_text = free["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(free_text.contains(" 6"), "{free_text:?}");
    let body = complete(json!({"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0, "stop": [" 6"]})).await;
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(!text.contains('6'), "{text:?}");
    assert!(free_text.starts_with(text), "{text:?} vs {free_text:?}");
}

#[tokio::test]
async fn same_seed_same_text_and_n_choices() {
    let req = json!({"model": MODEL, "prompt": "My favourite animal is", "max_tokens": 12, "temperature": 1.0, "seed": 42, "n": 2});
    let a = complete(req.clone()).await;
    let b = complete(req).await;
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(a["choices"][1]["index"], 1);
    let other = complete(json!({"model": MODEL, "prompt": "My favourite animal is", "max_tokens": 12, "temperature": 1.0, "seed": 7})).await;
    assert_eq!(
        a["usage"]["prompt_tokens"], other["usage"]["prompt_tokens"],
        "the prompt is counted once"
    );
    assert_ne!(other["choices"][0]["text"], a["choices"][0]["text"]);
}

#[tokio::test]
async fn usage_counts_the_prompt_tokens_found_in_the_prefix_cache() {
    // Long enough for several 16-token blocks; unique to this test so no
    // other test's request has cached it.
    let text = "usage-cache probe: ".to_string()
        + &"the quick brown fox jumps over the lazy dog, ".repeat(8);
    let req = json!({"model": MODEL, "messages": user(&text), "max_tokens": 2, "temperature": 0});
    let first = chat(req.clone()).await;
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 64, "{first}");
    // At most the chat template's opening (its default system prompt),
    // which other tests' chats share.
    let before = first["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(before <= 32, "{first}");
    let second = chat(req.clone()).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= before + 48 && cached < prompt, "{second}");
    assert_eq!(cached % 16, 0, "whole blocks: {second}");
    // n choices of one prompt count its cached tokens once; the stream's
    // usage chunk says the same.
    let mut many = req;
    many["n"] = json!(3);
    many["stream"] = json!(true);
    many["stream_options"] = json!({"include_usage": true});
    let reply = post(&with_model(), "/v1/chat/completions", &many.to_string()).await;
    let events = sse_events(&reply.text);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt, "{usage}");
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"], cached,
        "{usage}"
    );
}

#[tokio::test]
async fn completion_logprobs_have_top_candidates() {
    let body = complete(json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 3})).await;
    let lp = &body["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["tokens"][0], " Paris");
    let first = lp["token_logprobs"][0].as_f64().unwrap();
    assert!(first < 0.0 && first > -2.0, "{first}");
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert_eq!(top.len(), 3);
    assert!(top.contains_key(" Paris"));
}

#[tokio::test]
async fn chat_logprobs_have_top_candidates() {
    let body = chat(json!({"model": MODEL, "messages": user("Hi"), "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2})).await;
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty());
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert!(content[0]["logprob"].as_f64().unwrap() <= 0.0);
    assert!(content[0]["bytes"].is_array());
}

#[tokio::test]
async fn echo_prepends_the_prompt() {
    let body = complete(json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0, "echo": true})).await;
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("The capital of France is Paris"),
        "{text:?}"
    );
}

#[tokio::test]
async fn completion_stream_is_framed_and_matches_the_whole_answer() {
    let req = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let whole = complete(req.clone()).await;
    let mut stream_req = req;
    stream_req["stream"] = json!(true);
    stream_req["stream_options"] = json!({"include_usage": true});
    let reply = post(&with_model(), "/v1/completions", &stream_req.to_string()).await;
    assert_eq!(reply.status.as_u16(), 200);
    assert!(
        reply.content_type.starts_with("text/event-stream"),
        "{}",
        reply.content_type
    );
    let events = sse_events(&reply.text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut text = String::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "text_completion");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["text"].as_str().unwrap());
        }
    }
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 8);
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, "length");
}

#[tokio::test]
async fn chat_stream_starts_with_the_role_and_ends_with_done() {
    let req = json!({"model": MODEL, "messages": user("What is 2+2?"), "max_tokens": 16, "temperature": 0});
    let whole = chat(req.clone()).await;
    let mut stream_req = req;
    stream_req["stream"] = json!(true);
    let reply = post(
        &with_model(),
        "/v1/chat/completions",
        &stream_req.to_string(),
    )
    .await;
    let events = sse_events(&reply.text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
}

/// Value of `name{model="MODEL"}` in a Prometheus text page.
fn metric(page: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{model=\"{MODEL}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn metrics_count_generated_tokens_and_show_the_kv_pool() {
    let state = with_model();
    complete(
        json!({"model": MODEL, "prompt": "One, two, three,", "max_tokens": 3, "temperature": 0}),
    )
    .await;
    // A key is needed unless the server runs with --metrics-public.
    let refused = send(&state, "GET", "/metrics", None, None).await;
    assert_eq!(refused.status.as_u16(), 401);
    let reply = send(&state, "GET", "/metrics", Some(KEY), None).await;
    assert_eq!(reply.status.as_u16(), 200);
    let page = reply.text;
    assert!(
        page.contains("# TYPE hearth_generation_tokens_total counter"),
        "{page}"
    );
    assert!(metric(&page, "hearth_generation_tokens_total") >= 3.0);
    assert!(metric(&page, "hearth_prompt_tokens_total") >= 5.0);
    assert!(metric(&page, "hearth_kv_cache_blocks_total") >= 8192.0 / 16.0);
    let usage = metric(&page, "hearth_kv_cache_usage_ratio");
    assert!((0.0..=1.0).contains(&usage));
}
