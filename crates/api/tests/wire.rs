//! Wire types: request unions deserialize, responses and chunks serialize in
//! OpenAI's shapes.

use hearth_api::{
    parse_json_body, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ChatResponseMessage, CompletionChoice, CompletionChunk,
    CompletionLogprobs, CompletionRequest, CompletionResponse, MessageContent, ModelList,
    ModelObject, ModelPricing, Prompt, Stop, UsageInfo,
};
use hearth_core::{FinishReason, TokenCandidate, TokenLogprobs};
use serde_json::json;

fn prompt_of(body: serde_json::Value) -> Prompt {
    let body = json!({"model": "m", "prompt": body}).to_string();
    parse_json_body::<CompletionRequest>(body.as_bytes())
        .unwrap()
        .prompt
}

#[test]
fn prompt_variants() {
    assert_eq!(prompt_of(json!("hi")), Prompt::Text("hi".into()));
    assert_eq!(
        prompt_of(json!(["a", "b"])),
        Prompt::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(prompt_of(json!([1, 2, 3])), Prompt::Tokens(vec![1, 2, 3]));
    assert_eq!(
        prompt_of(json!([[1], [2, 3]])),
        Prompt::TokenBatches(vec![vec![1], vec![2, 3]])
    );
    assert_eq!(prompt_of(json!([])), Prompt::Texts(vec![]));
}

#[test]
fn prompt_mixed_array_is_422() {
    let body = json!({"model": "m", "prompt": ["a", 1]}).to_string();
    let err = parse_json_body::<CompletionRequest>(body.as_bytes()).unwrap_err();
    assert_eq!(err.status(), 422);
    assert_eq!(
        err.body_json()["detail"][0]["loc"],
        json!(["body", "prompt"])
    );
}

#[test]
fn stop_variants() {
    let one: Stop = serde_json::from_value(json!("\n")).unwrap();
    assert_eq!(one.into_vec(), vec!["\n".to_string()]);
    let many: Stop = serde_json::from_value(json!(["a", "b"])).unwrap();
    assert_eq!(many.into_vec(), vec!["a".to_string(), "b".to_string()]);
}

#[test]
fn chat_content_string_and_text_parts() {
    let body = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}
        ]
    })
    .to_string();
    let req: ChatCompletionRequest = parse_json_body(body.as_bytes()).unwrap();
    assert_eq!(
        req.messages[0].content,
        Some(MessageContent::Text("be brief".into()))
    );
    match &req.messages[1].content {
        Some(MessageContent::Parts(parts)) => {
            assert_eq!(parts.len(), 2);
            assert_eq!(parts[1].kind, "text");
            assert_eq!(parts[1].text.as_deref(), Some("b"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(req.messages[2].content, None);
    let valid = req.validate().unwrap();
    assert_eq!(valid.messages[1].content, "a\nb");
    assert_eq!(valid.messages[2].content, "");
}

fn token(text: &str, logprob: f32) -> TokenCandidate {
    TokenCandidate {
        id: 7,
        text: text.into(),
        bytes: text.as_bytes().to_vec(),
        logprob,
    }
}

#[test]
fn completion_response_shape() {
    let lp = TokenLogprobs {
        chosen: token("Hé", -0.5),
        top: vec![token("Hé", -0.5), token("Ha", -1.25)],
    };
    let lp2 = TokenLogprobs {
        chosen: token("llo", -0.25),
        top: vec![],
    };
    let choice = CompletionChoice {
        index: 0,
        text: "Héllo".into(),
        logprobs: Some(CompletionLogprobs::from_tokens(&[lp, lp2], 3)),
        finish_reason: Some(FinishReason::Length),
    };
    let resp = CompletionResponse::new(
        "cmpl-1".into(),
        1700000000,
        "m".into(),
        vec![choice],
        UsageInfo::new(3, 2, 0),
    );
    let v = serde_json::to_value(&resp).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["service_tier"], "default");
    assert!(v["system_fingerprint"].is_null());
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let lps = &v["choices"][0]["logprobs"];
    assert_eq!(lps["tokens"], json!(["Hé", "llo"]));
    assert_eq!(lps["token_logprobs"], json!([-0.5, -0.25]));
    assert_eq!(lps["top_logprobs"][0], json!({"Hé": -0.5, "Ha": -1.25}));
    // The sampled token is always among its position's entries (OpenAI's
    // "up to logprobs + 1"), even when it is not among the top ones.
    assert_eq!(lps["top_logprobs"][1], json!({"llo": -0.25}));
    assert_eq!(lps["text_offset"], json!([3, 5]));
    // Order of `top_logprobs` is kept (best first) through text.
    let text = serde_json::to_string(&resp).unwrap();
    assert!(text.contains(r#"{"Hé":-0.5,"Ha":-1.25}"#), "{text}");
    let back: CompletionResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(back, resp);
}

#[test]
fn completion_chunks() {
    let chunk = CompletionChunk::new(
        "cmpl-1".into(),
        1,
        "m".into(),
        vec![CompletionChoice {
            index: 0,
            text: "Hi".into(),
            logprobs: None,
            finish_reason: None,
        }],
    );
    let v = serde_json::to_value(&chunk).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["finish_reason"].is_null());
    assert!(v["choices"][0]["logprobs"].is_null());
    assert!(v["usage"].is_null());

    let usage = serde_json::to_value(CompletionChunk::usage(
        "cmpl-1".into(),
        1,
        "m".into(),
        UsageInfo::new(4, 6, 4),
    ))
    .unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10,
               "prompt_tokens_details": {"cached_tokens": 4}})
    );
    assert_eq!(usage["object"], "text_completion");
}

#[test]
fn chat_response_shape() {
    let lp = TokenLogprobs {
        chosen: token("Hi", -0.1),
        top: vec![token("Hi", -0.1)],
    };
    let resp = ChatCompletionResponse::new(
        "chatcmpl-1".into(),
        5,
        "m".into(),
        vec![ChatChoice {
            index: 0,
            message: ChatResponseMessage::assistant("Hi"),
            logprobs: Some(ChatLogprobs::from_tokens(&[lp])),
            finish_reason: Some(FinishReason::Stop),
        }],
        UsageInfo::new(1, 1, 0),
    );
    let v = serde_json::to_value(&resp).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "Hi"})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let content = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(content["token"], "Hi");
    assert_eq!(content["bytes"], json!([72, 105]));
    assert_eq!(content["top_logprobs"][0]["token"], "Hi");
    assert!(content["logprob"].is_f64());
}

#[test]
fn chat_chunks() {
    let first = ChatCompletionChunk::new(
        "chatcmpl-1".into(),
        1,
        "m".into(),
        vec![ChatChunkChoice::role(0)],
    );
    let v = serde_json::to_value(&first).unwrap();
    assert_eq!(v["object"], "chat.completion.chunk");
    assert_eq!(v["service_tier"], "default");
    assert_eq!(
        v["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(v["choices"][0]["finish_reason"].is_null());
    assert!(v["usage"].is_null());

    let text = serde_json::to_value(ChatChunkChoice::content(0, "Hel", None)).unwrap();
    assert_eq!(text["delta"], json!({"content": "Hel"}));

    let last = serde_json::to_value(ChatChunkChoice::finish(0, FinishReason::Stop)).unwrap();
    assert_eq!(last["delta"], json!({}));
    assert_eq!(last["finish_reason"], "stop");

    let usage = serde_json::to_value(ChatCompletionChunk::usage(
        "chatcmpl-1".into(),
        1,
        "m".into(),
        UsageInfo::new(2, 3, 0),
    ))
    .unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["total_tokens"], 5);
}

#[test]
fn model_list_plain_and_verbose() {
    let plain = ModelObject::new("SmolLM2", 1, "hearth");
    let mut verbose = ModelObject::new("MiniLM", 2, "hearth");
    verbose.kind = Some("embed".into());
    verbose.context_length = Some(512);
    verbose.pricing = Some(ModelPricing {
        input_per_million: 0.01,
        output_per_million: 0.0,
    });
    let v = serde_json::to_value(ModelList::new(vec![plain, verbose])).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(
        v["data"][0],
        json!({"id": "SmolLM2", "object": "model", "created": 1, "owned_by": "hearth"})
    );
    assert_eq!(v["data"][1]["kind"], "embed");
    assert_eq!(v["data"][1]["context_length"], 512);
    assert_eq!(v["data"][1]["pricing"]["input_per_million"], 0.01);
    assert!(v["data"][1].get("description").is_none());
}
