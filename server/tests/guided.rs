//! The vLLM-style `guided_*` extensions on completions and chat with the
//! default model: `guided_choice` gives exactly one of the strings,
//! `guided_regex` text matching the expression, `guided_grammar` text of the
//! Lark grammar, `guided_json` JSON of the schema; conflicting or broken
//! specifications are 400 naming the field.

mod common;

use common::raw::*;
use common::*;
use serde_json::{json, Value};

async fn post(uri: &str, body: Value) -> Raw {
    post_json(&with_model(), uri, &body).await
}

fn texts(body: &Value) -> Vec<String> {
    body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["text"]
                .as_str()
                .or_else(|| c["message"]["content"].as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

fn digits(s: &str, n: std::ops::RangeInclusive<usize>) -> bool {
    n.contains(&s.len()) && s.chars().all(|c| c.is_ascii_digit())
}

#[tokio::test]
async fn choice_regex_grammar_and_json_shape_the_output() {
    let reply = post(
        "/v1/completions",
        json!({"model": MODEL, "prompt": "The review 'I loved it' is", "n": 3, "temperature": 1.0,
               "max_tokens": 10, "guided_choice": ["positive", "negative", "neutral"]}),
    )
    .await;
    reply.expect_status(200);
    for text in texts(&reply.json()) {
        assert!(
            ["positive", "negative", "neutral"].contains(&text.as_str()),
            "{text}"
        );
    }

    let reply = post(
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Call me at", "n": 2, "temperature": 1.0,
               "max_tokens": 20, "guided_regex": "[0-9]{3}-[0-9]{4}"}),
    )
    .await;
    for text in texts(&reply.json()) {
        let (a, b) = text.split_once('-').unwrap_or_else(|| panic!("{text}"));
        assert!(digits(a, 3..=3) && digits(b, 4..=4), "{text}");
    }

    let reply = post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Add two numbers."}],
               "temperature": 0.8, "max_tokens": 20,
               "guided_grammar": "start: NUM \" + \" NUM \" = \" NUM\nNUM: /[0-9]{1,3}/"}),
    )
    .await;
    reply.expect_status(200);
    let text = &texts(&reply.json())[0];
    let parts: Vec<&str> = text.split(' ').collect();
    assert_eq!(parts.len(), 5, "{text}");
    assert!(
        digits(parts[0], 1..=3) && parts[1] == "+" && digits(parts[2], 1..=3),
        "{text}"
    );
    assert!(parts[3] == "=" && digits(parts[4], 1..=3), "{text}");

    let reply = post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "A city."}], "max_tokens": 60,
               "guided_json": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                               "required": ["city"], "additionalProperties": false}}),
    )
    .await;
    let v: Value = serde_json::from_str(&texts(&reply.json())[0]).unwrap();
    assert!(v["city"].is_string(), "{v}");
}

#[tokio::test]
async fn conflicting_or_broken_specifications_are_refused() {
    for (uri, extra, param) in [
        (
            "/v1/completions",
            json!({"guided_regex": "a", "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (
            "/v1/completions",
            json!({"guided_regex": "(unclosed"}),
            "guided_regex",
        ),
        (
            "/v1/completions",
            json!({"guided_grammar": "start: missing_rule"}),
            "guided_grammar",
        ),
        (
            "/v1/completions",
            json!({"guided_choice": []}),
            "guided_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"guided_regex": "a", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ] {
        let mut body = if uri == "/v1/completions" {
            json!({"model": MODEL, "prompt": "x", "max_tokens": 4})
        } else {
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
        };
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = post(uri, body.clone()).await;
        reply.expect_status(400);
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
}
