//! Parsing of JSON bodies and query strings into 422 (shape C) items.

use hearth_api::{
    parse_json_body, parse_query, ApiError, ChatCompletionRequest, CompletionRequest, ModelsQuery,
    ProjectQuery,
};
use serde::Deserialize;
use serde_json::{json, Value};

fn item(err: &ApiError) -> Value {
    assert_eq!(err.status(), 422, "{err}");
    let body = err.body_json();
    assert_eq!(body["detail"].as_array().unwrap().len(), 1, "{body}");
    body["detail"][0].clone()
}

#[test]
fn empty_body_is_missing() {
    let err = parse_json_body::<CompletionRequest>(b"").unwrap_err();
    assert_eq!(
        item(&err),
        json!({"type": "missing", "loc": ["body"], "msg": "Field required", "input": null})
    );
}

#[test]
fn invalid_json_is_json_invalid_with_offset() {
    let err = parse_json_body::<CompletionRequest>(b"{\"model\": }").unwrap_err();
    let item = item(&err);
    assert_eq!(item["type"], "json_invalid");
    assert_eq!(item["msg"], "JSON decode error");
    assert_eq!(item["loc"], json!(["body", 10]));
    assert_eq!(item["input"], json!({}));
    let ctx = item["ctx"]["error"].as_str().unwrap();
    assert!(!ctx.is_empty() && !ctx.contains("line"), "{ctx}");
}

#[test]
fn invalid_json_offset_on_later_line() {
    let err = parse_json_body::<CompletionRequest>(b"{\n  \"model\": x\n}").unwrap_err();
    assert_eq!(item(&err)["loc"], json!(["body", 13]));
}

#[test]
fn missing_model() {
    let err = parse_json_body::<CompletionRequest>(br#"{"prompt": "hi"}"#).unwrap_err();
    assert_eq!(
        item(&err),
        json!({"type": "missing", "loc": ["body", "model"], "msg": "Field required",
               "input": {"prompt": "hi"}})
    );
}

#[test]
fn missing_nested_field_loc_and_input() {
    let body =
        br#"{"model": "m", "messages": [{"role": "user", "content": "a"}, {"content": "b"}]}"#;
    let err = parse_json_body::<ChatCompletionRequest>(body).unwrap_err();
    let item = item(&err);
    assert_eq!(item["type"], "missing");
    assert_eq!(item["loc"], json!(["body", "messages", 1, "role"]));
    assert_eq!(item["input"], json!({"content": "b"}));
}

#[test]
fn wrong_type_in_nested_array_has_integer_index() {
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#;
    let err = parse_json_body::<ChatCompletionRequest>(body).unwrap_err();
    let item = item(&err);
    assert_eq!(item["loc"], json!(["body", "messages", 0, "content"]));
    assert!(item["loc"][2].is_u64());
    assert_eq!(item["input"], 5);
    assert!(item["type"].is_string());
}

#[test]
fn wrong_type_string_int_bool_float_list() {
    let cases: [(&[u8], &str, Value); 6] = [
        (
            br#"{"model": 5, "prompt": "x"}"#,
            "string_type",
            json!(["body", "model"]),
        ),
        (
            br#"{"model": "m", "prompt": "x", "max_tokens": "ten"}"#,
            "int_type",
            json!(["body", "max_tokens"]),
        ),
        (
            br#"{"model": "m", "prompt": "x", "max_tokens": 1.5}"#,
            "int_type",
            json!(["body", "max_tokens"]),
        ),
        (
            br#"{"model": "m", "prompt": "x", "echo": "yes"}"#,
            "bool_type",
            json!(["body", "echo"]),
        ),
        (
            br#"{"model": "m", "prompt": "x", "temperature": "hot"}"#,
            "float_type",
            json!(["body", "temperature"]),
        ),
        (
            br#"{"model": "m", "prompt": "x", "logit_bias": [1]}"#,
            "dict_type",
            json!(["body", "logit_bias"]),
        ),
    ];
    for (body, kind, loc) in cases {
        let err = parse_json_body::<CompletionRequest>(body).unwrap_err();
        let item = item(&err);
        assert_eq!(item["type"], kind, "{item}");
        assert_eq!(item["loc"], loc, "{item}");
    }
    let err = parse_json_body::<ChatCompletionRequest>(br#"{"model": "m", "messages": "hi"}"#)
        .unwrap_err();
    let item = item(&err);
    assert_eq!(item["type"], "list_type");
    assert_eq!(item["msg"], "Input should be a valid list");
    assert_eq!(item["input"], "hi");
}

#[test]
fn string_type_message_and_null_input() {
    let err =
        parse_json_body::<CompletionRequest>(br#"{"model": null, "prompt": "x"}"#).unwrap_err();
    assert_eq!(
        item(&err),
        json!({"type": "string_type", "loc": ["body", "model"],
               "msg": "Input should be a valid string", "input": null})
    );
}

#[test]
fn token_id_of_wrong_type_inside_prompt() {
    let err =
        parse_json_body::<CompletionRequest>(br#"{"model": "m", "prompt": [[1, 2], [3, "x"]]}"#)
            .unwrap_err();
    let item = item(&err);
    assert_eq!(item["loc"], json!(["body", "prompt", 1, 1]));
    assert_eq!(item["type"], "int_type");
    assert_eq!(item["input"], "x");
}

#[test]
fn body_not_an_object() {
    let err = parse_json_body::<CompletionRequest>(b"[1, 2]").unwrap_err();
    let item = item(&err);
    assert_eq!(item["type"], "model_attributes_type");
    assert_eq!(item["loc"], json!(["body"]));
    assert_eq!(item["input"], json!([1, 2]));
}

#[test]
fn unknown_fields_are_ignored() {
    let req: CompletionRequest =
        parse_json_body(br#"{"model": "m", "prompt": "x", "whatever": {"a": 1}}"#).unwrap();
    assert_eq!(req.model, "m");
}

#[test]
fn query_bool_good_values() {
    for (q, want) in [
        ("verbose=true", true),
        ("verbose=false", false),
        ("verbose=1", true),
        ("verbose=0", false),
        ("verbose=yes", true),
        ("verbose=no", false),
        ("verbose=on", true),
        ("verbose=off", false),
        ("verbose=TRUE", true),
        ("ai_project_id=p1", false),
    ] {
        let query: ModelsQuery = parse_query(Some(q)).unwrap();
        assert_eq!(query.verbose, want, "{q}");
    }
    let query: ModelsQuery = parse_query(None).unwrap();
    assert_eq!(query, ModelsQuery::default());
    let query: ModelsQuery = parse_query(Some("verbose=1&ai_project_id=proj-1")).unwrap();
    assert_eq!(query.ai_project_id.as_deref(), Some("proj-1"));
}

#[test]
fn query_bool_bad_value() {
    let err = parse_query::<ModelsQuery>(Some("verbose=notabool")).unwrap_err();
    assert_eq!(
        item(&err),
        json!({"type": "bool_parsing", "loc": ["query", "verbose"],
               "msg": "Input should be a valid boolean, unable to interpret input",
               "input": "notabool"})
    );
}

#[test]
fn query_int_parsing_and_missing() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct ListQuery {
        limit: i64,
    }
    let err = parse_query::<ListQuery>(Some("limit=abc")).unwrap_err();
    let got = item(&err);
    assert_eq!(got["type"], "int_parsing");
    assert_eq!(got["loc"], json!(["query", "limit"]));
    assert_eq!(got["input"], "abc");
    let err = parse_query::<ListQuery>(Some("")).unwrap_err();
    assert_eq!(
        item(&err),
        json!({"type": "missing", "loc": ["query", "limit"], "msg": "Field required", "input": null})
    );
}

#[test]
fn project_query() {
    let q: ProjectQuery = parse_query(Some("ai_project_id=abc&other=1")).unwrap();
    assert_eq!(q.project_id(), Some("abc"));
    let q: ProjectQuery = parse_query(Some("ai_project_id=")).unwrap();
    assert_eq!(q.project_id(), None);
}

/// A body `depth` arrays deep in a field the request does not read.
fn nested_in_unread_field(depth: usize) -> Vec<u8> {
    let inner = format!("{}{}", "[".repeat(depth - 1), "]".repeat(depth - 1));
    format!(r#"{{"model": "m", "prompt": "p", "unread": {inner}}}"#).into_bytes()
}

#[test]
fn nesting_is_bounded_in_every_field_read_or_not() {
    // The object itself is level 1: 127 levels in all parse.
    assert!(parse_json_body::<CompletionRequest>(&nested_in_unread_field(127)).is_ok());
    for depth in [128, 129, 100_000] {
        let body = nested_in_unread_field(depth);
        let err = parse_json_body::<CompletionRequest>(&body).unwrap_err();
        let item = item(&err);
        assert_eq!(item["type"], "json_invalid", "{depth}");
        // The offset of the bracket that reached 128 levels.
        let at = item["loc"][1].as_u64().unwrap() as usize;
        assert_eq!(body[at], b'[', "{depth}");
        let ctx = item["ctx"]["error"].as_str().unwrap();
        assert!(ctx.contains("128"), "{ctx}");
    }
    // Brackets inside strings (escaped quotes too) do not count.
    let text = format!(r#"{{"model": "m", "prompt": "\"{}"}}"#, "[".repeat(500));
    assert!(parse_json_body::<CompletionRequest>(text.as_bytes()).is_ok());
    // Read fields keep serde's own limit: the same answer.
    let deep = format!(
        r#"{{"model": "m", "prompt": "p", "logit_bias": {}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let err = parse_json_body::<CompletionRequest>(deep.as_bytes()).unwrap_err();
    assert_eq!(item(&err)["type"], "json_invalid");
}
