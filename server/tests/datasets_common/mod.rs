//! Helpers the dataset tests share: requests, answer checks, schemas,
//! parts and the rows of the upload flow.

#![allow(dead_code)]

use hearth_server::AppState;
use serde_json::{json, Value};

use crate::common::raw::*;
use crate::common::*;

/// Asserts 200 and gives the JSON body.
pub fn ok(reply: &Raw) -> Value {
    assert_eq!(reply.status, 200, "{}", text(reply));
    reply.json()
}

/// Asserts a 400 shape B and gives its `error` object.
pub fn shape_b(reply: &Raw) -> Value {
    assert_eq!(reply.status, 400, "{}", text(reply));
    let body = reply.json();
    let error = body["error"].clone();
    assert!(error["message"].is_string(), "shape B: {body}");
    error
}

/// The message of a 400 shape B.
pub fn message_400(reply: &Raw) -> String {
    shape_b(reply)["message"].as_str().unwrap().to_string()
}

pub fn schema_of(columns: &[(&str, &str)]) -> Value {
    Value::Array(
        columns
            .iter()
            .map(|(name, ty)| json!({"name": name, "type": {"name": ty}}))
            .collect(),
    )
}

/// A column of each type.
pub fn full_schema() -> Value {
    schema_of(&[
        ("prompt", "string"),
        ("count", "integer"),
        ("score", "float"),
        ("ok", "boolean"),
        ("meta", "json"),
    ])
}

pub async fn create_upload(state: &AppState, key: &str, uri: &str, body: Value) -> Value {
    ok(&call(state, "POST", uri, key, Some(body)).await)
}

pub async fn add_part(
    state: &AppState,
    key: &str,
    upload: &str,
    file_name: &str,
    data: &[u8],
) -> Raw {
    add_part_at(
        state,
        key,
        &format!("/v1/datasets/uploads/{upload}/parts"),
        file_name,
        data,
    )
    .await
}

pub async fn add_part_at(
    state: &AppState,
    key: &str,
    uri: &str,
    file_name: &str,
    data: &[u8],
) -> Raw {
    let body = form(&[("data", Some(file_name), data)]);
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    request(state, "POST", uri, Some(key), Some(&ct), body).await
}

/// Adds a part that must be accepted; its id, after checking the record.
pub async fn part_ok(
    state: &AppState,
    upload: &str,
    file_name: &str,
    data: &[u8],
    rows: i64,
) -> String {
    let part = ok(&add_part(state, KEY, upload, file_name, data).await);
    let id = part["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("dspart-"), "{part}");
    assert_eq!(part["object"], "dataset.upload.part", "{part}");
    assert_eq!(part["upload_id"], upload, "{part}");
    assert_eq!(part["rows"], rows, "{part}");
    assert!(part["bytes"].as_i64().unwrap() > 0, "{part}");
    assert!(part["created_at"].is_i64(), "{part}");
    id
}

pub async fn complete(state: &AppState, key: &str, upload: &str, part_ids: &[&str]) -> Raw {
    call(
        state,
        "POST",
        &format!("/v1/datasets/uploads/{upload}/complete"),
        key,
        Some(json!({ "part_ids": part_ids })),
    )
    .await
}

pub async fn cancel(state: &AppState, key: &str, upload: &str) -> Raw {
    call(
        state,
        "POST",
        &format!("/v1/datasets/uploads/{upload}/cancel"),
        key,
        None,
    )
    .await
}

/// `POST /v1/datasets` (the direct variant), which must succeed.
pub async fn create_direct(state: &AppState, body: Value) -> Value {
    let dataset = ok(&call(state, "POST", "/v1/datasets", KEY, Some(body)).await);
    assert!(
        dataset["id"].as_str().unwrap().starts_with("dataset-"),
        "{dataset}"
    );
    assert_eq!(dataset["object"], "dataset");
    dataset
}

pub fn id_of(value: &Value) -> String {
    value["id"].as_str().expect("an id").to_string()
}

pub async fn get_dataset(state: &AppState, id: &str) -> Value {
    ok(&get(state, &format!("/v1/datasets/{id}"), Some(KEY)).await)
}

pub async fn content(state: &AppState, id: &str, query: &str) -> Raw {
    get(
        state,
        &format!("/v1/datasets/{id}/content{query}"),
        Some(KEY),
    )
    .await
}

pub async fn export(state: &AppState, id: &str, query: &str) -> Raw {
    get(
        state,
        &format!("/v1/datasets/{id}/export{query}"),
        Some(KEY),
    )
    .await
}

pub fn content_type(reply: &Raw) -> String {
    reply
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// RFC 4180 records: quoted cells with doubled quotes, line breaks inside
/// quotes, records ended by CRLF or LF.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut cell = String::new();
    let mut started = false;
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    cell.push('"');
                } else {
                    quoted = false;
                }
            } else {
                cell.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                assert!(cell.is_empty(), "a quote inside an unquoted cell: {text:?}");
                quoted = true;
                started = true;
            }
            ',' => {
                record.push(std::mem::take(&mut cell));
                started = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut cell));
                records.push(std::mem::take(&mut record));
                started = false;
            }
            c => {
                cell.push(c);
                started = true;
            }
        }
    }
    assert!(!quoted, "an unterminated quoted cell: {text:?}");
    if started {
        record.push(cell);
        records.push(record);
    }
    records
}

/// The `i` values of a content page.
pub fn indices(page: &Value) -> Vec<i64> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["i"].as_i64().unwrap())
        .collect()
}

// ---- the rows of the upload flow ----

pub const JSONL_PART: &str = concat!(
    r#"{"prompt": "hello", "count": 1, "score": 0.5, "ok": true, "meta": {"a": {"b": [1, 2]}, "c": null}}"#,
    "\n",
    r#"{"prompt": null, "count": -7, "score": 2, "ok": false, "meta": [1, "x", {"y": false}]}"#,
    "\n",
    r#"{"count": null, "score": null, "ok": null, "meta": null}"#,
    "\n",
);

/// The CSV header in another order than the schema; the first row's
/// `prompt` holds a comma, quotes and a line break.
pub const CSV_PART: &str = concat!(
    "count,prompt,meta,score,ok\r\n",
    "42,\"He said \"\"hi\"\", then\nleft\",\"{\"\"k\"\": {\"\"deep\"\": [true, null]}}\",3.25,TRUE\r\n",
    "0,,,,false\r\n",
    ",plain,\"\"\"s\"\"\",-1.5,\r\n",
);

pub fn jsonl_rows() -> Vec<Value> {
    vec![
        json!({"prompt": "hello", "count": 1, "score": 0.5, "ok": true,
               "meta": {"a": {"b": [1, 2]}, "c": null}}),
        json!({"prompt": null, "count": -7, "score": 2.0, "ok": false,
               "meta": [1, "x", {"y": false}]}),
        json!({"prompt": null, "count": null, "score": null, "ok": null, "meta": null}),
    ]
}

pub fn csv_rows() -> Vec<Value> {
    vec![
        json!({"prompt": "He said \"hi\", then\nleft", "count": 42, "score": 3.25, "ok": true,
               "meta": {"k": {"deep": [true, null]}}}),
        json!({"prompt": null, "count": 0, "score": null, "ok": false, "meta": null}),
        json!({"prompt": "plain", "count": null, "score": -1.5, "ok": null, "meta": "s"}),
    ]
}
