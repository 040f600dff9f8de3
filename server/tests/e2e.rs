//! Starts the real `hearth` binary on a free port and talks to it over HTTP.

mod common;

use std::io::{BufRead, BufReader, Read};

use common::binary::Server;
use common::*;
use serde_json::{json, Value};

fn start() -> Server {
    common::binary::start(&temp_dir(), &[])
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(120))
        .build()
}

#[test]
fn serves_chat_and_streams_over_http() {
    let server = start();
    let agent = agent();

    let health = agent
        .get(&format!("{}/health", server.base))
        .call()
        .unwrap();
    assert_eq!(health.status(), 200);

    match agent.get(&format!("{}/v1/models", server.base)).call() {
        Err(ureq::Error::Status(401, r)) => {
            let body: Value = r.into_json().unwrap();
            assert!(body["detail"].is_string());
        }
        other => panic!("expected 401, got {other:?}"),
    }

    let auth = format!("Bearer {KEY}");
    let body: Value = agent
        .post(&format!("{}/v1/chat/completions", server.base))
        .set("Authorization", &auth)
        .send_json(json!({"model": MODEL, "messages": [{"role": "user", "content": "List three primary colors."}], "temperature": 0, "max_tokens": 24}))
        .unwrap()
        .into_json()
        .unwrap();
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(
        content.contains("red") && content.contains("blue"),
        "{body}"
    );

    let response = agent
        .post(&format!("{}/v1/chat/completions", server.base))
        .set("Authorization", &auth)
        .send_json(json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 20}))
        .unwrap();
    assert!(response.content_type().starts_with("text/event-stream"));
    let mut text = String::new();
    response.into_reader().read_to_string(&mut text).unwrap();
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(events.len() > 3, "{events:?}");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
}

#[test]
fn a_client_that_leaves_mid_stream_does_not_hurt_the_next() {
    let server = start();
    let agent = agent();
    let auth = format!("Bearer {KEY}");
    for _ in 0..3 {
        let response = agent
            .post(&format!("{}/v1/completions", server.base))
            .set("Authorization", &auth)
            .send_json(json!({"model": MODEL, "stream": true, "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": true}))
            .unwrap();
        let mut reader = BufReader::new(response.into_reader());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("data: "), "{line:?}");
        drop(reader);
    }
    let body: Value = agent
        .post(&format!("{}/v1/completions", server.base))
        .set("Authorization", &auth)
        .send_json(json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}))
        .unwrap()
        .into_json()
        .unwrap();
    assert!(
        body["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" Paris"),
        "{body}"
    );
}
