//! `/v1/embeddings` and `/v1/rerank` wire types: parsing the `input` union,
//! the 422/400 validation rules, base64 vectors, `dimensions`, and rerank
//! result ordering.

use hearth_api::{
    apply_dimensions, decode_base64, encode_base64, parse_json_body, EmbeddingList,
    EmbeddingRequest, EncodingFormat, ErrorBody, PromptInput, RerankRequest, RerankResponse,
};
use serde_json::json;

fn embed(body: serde_json::Value) -> Result<hearth_api::ValidEmbedding, hearth_api::ApiError> {
    parse_json_body::<EmbeddingRequest>(body.to_string().as_bytes())?.validate()
}

fn validation_kind(e: &hearth_api::ApiError) -> (String, serde_json::Value) {
    assert_eq!(e.status(), 422, "{e}");
    match e.body() {
        ErrorBody::Validation(items) => (items[0].kind.clone(), json!(items[0].loc)),
        other => panic!("not shape C: {other:?}"),
    }
}

#[test]
fn input_union_and_defaults() {
    let v = embed(json!({"model": "m", "input": "hi"})).unwrap();
    assert_eq!(v.inputs, vec![PromptInput::Text("hi".into())]);
    assert_eq!(v.encoding_format, EncodingFormat::Float);
    assert!(!v.truncate);
    let v = embed(
        json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64",
        "dimensions": 8, "user": "u", "truncate": true}),
    )
    .unwrap();
    assert_eq!(v.inputs.len(), 2);
    assert_eq!(v.encoding_format, EncodingFormat::Base64);
    assert_eq!(v.dimensions, Some(8));
    assert!(v.truncate);
    let v = embed(json!({"model": "m", "input": [1, 2, 3]})).unwrap();
    assert_eq!(v.inputs, vec![PromptInput::Tokens(vec![1, 2, 3])]);
    let v = embed(json!({"model": "m", "input": [[1], [2, 3]]})).unwrap();
    assert_eq!(v.inputs[1], PromptInput::Tokens(vec![2, 3]));
}

#[test]
fn validation_errors() {
    let e = embed(json!({"model": "m", "input": ""})).unwrap_err();
    assert_eq!(
        validation_kind(&e),
        ("string_too_short".into(), json!(["body", "input"]))
    );
    let e = embed(json!({"model": "m", "input": ["a", ""]})).unwrap_err();
    assert_eq!(
        validation_kind(&e),
        ("string_too_short".into(), json!(["body", "input", 1]))
    );
    let e = embed(json!({"model": "m", "input": []})).unwrap_err();
    assert_eq!(
        validation_kind(&e),
        ("too_short".into(), json!(["body", "input"]))
    );
    let many: Vec<String> = (0..2049).map(|i| i.to_string()).collect();
    let e = embed(json!({"model": "m", "input": many})).unwrap_err();
    assert_eq!(
        validation_kind(&e),
        ("too_long".into(), json!(["body", "input"]))
    );
    let e = embed(json!({"model": "m", "input": [[1], []]})).unwrap_err();
    assert_eq!(
        validation_kind(&e),
        ("too_short".into(), json!(["body", "input", 1]))
    );
    let e = embed(json!({"model": "m", "input": "x", "dimensions": 0})).unwrap_err();
    assert_eq!(validation_kind(&e).0, "greater_than_equal");
    let e = embed(json!({"model": "m", "input": "x", "encoding_format": "hex"})).unwrap_err();
    assert_eq!(e.status(), 422);
    let e = embed(json!({"model": "m"})).unwrap_err();
    assert_eq!(validation_kind(&e).0, "missing");
    let e = embed(json!({"model": "m", "input": [-1]})).unwrap_err();
    assert_eq!(e.status(), 400);
    assert_eq!(e.param(), Some("input"));
}

#[test]
fn base64_round_trip_is_exact() {
    let v = vec![0.0f32, -1.5, 3.25e-8, f32::MAX, 0.123_456_79];
    let text = encode_base64(&v);
    assert_eq!(decode_base64(&text).unwrap(), v);
    // Little-endian f32: 1.0 is 00 00 80 3f.
    assert_eq!(encode_base64(&[1.0]), "AACAPw==");
    assert!(decode_base64("AAA=").is_none());
    let list = EmbeddingList::new(
        "m".into(),
        std::slice::from_ref(&v),
        EncodingFormat::Base64,
        3,
    );
    let body = serde_json::to_value(&list).unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["object"], "embedding");
    assert_eq!(body["data"][0]["index"], 0);
    assert_eq!(body["data"][0]["embedding"], json!(text));
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "total_tokens": 3})
    );
}

#[test]
fn dimensions_truncate_then_renormalise() {
    let v = [0.6f32, 0.0, 0.8, 0.0];
    assert_eq!(apply_dimensions(&v, 1), vec![1.0]);
    let two = apply_dimensions(&[3.0, 4.0, 12.0], 2);
    assert!((two[0] - 0.6).abs() < 1e-7 && (two[1] - 0.8).abs() < 1e-7);
    assert_eq!(apply_dimensions(&[0.0, 0.0, 1.0], 2), vec![0.0, 0.0]);
    assert_eq!(apply_dimensions(&v, 10).len(), 4);
}

#[test]
fn rerank_validation_and_ordering() {
    let parse = |b: serde_json::Value| {
        parse_json_body::<RerankRequest>(b.to_string().as_bytes()).and_then(|r| r.validate())
    };
    let r = parse(json!({"model": "m", "query": "q",
        "documents": ["a", {"text": "b"}, "c"], "top_n": 2}))
    .unwrap();
    assert_eq!(r.documents, vec!["a", "b", "c"]);
    assert!(r.return_documents);
    let resp = RerankResponse::new("id".into(), "m".into(), &r, &[0.1, 0.9, 0.5], 7);
    let idx: Vec<usize> = resp.results.iter().map(|x| x.index).collect();
    assert_eq!(idx, vec![1, 2]);
    assert_eq!(resp.results[0].document.as_ref().unwrap().text, "b");
    let body = serde_json::to_value(&resp).unwrap();
    assert_eq!(body["usage"]["total_tokens"], 7);
    let r = parse(json!({"model": "m", "query": "q", "documents": ["a"],
        "return_documents": false}))
    .unwrap();
    let resp = RerankResponse::new("id".into(), "m".into(), &r, &[0.3], 1);
    assert!(serde_json::to_value(&resp).unwrap()["results"][0]
        .get("document")
        .is_none());
    for bad in [
        json!({"model": "m", "query": "q", "documents": []}),
        json!({"model": "m", "query": "q", "documents": vec!["d"; 1001]}),
        json!({"model": "m", "query": "", "documents": ["d"]}),
        json!({"model": "m", "query": "q", "documents": ["d"], "top_n": 0}),
        json!({"model": "m", "query": "q", "documents": [3]}),
        json!({"model": "m", "documents": ["d"]}),
    ] {
        assert_eq!(parse(bad.clone()).unwrap_err().status(), 422, "{bad}");
    }
}
