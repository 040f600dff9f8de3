//! `/v1/datasets` through the in-process router (no model needed): uploads
//! in parts (JSON Lines and CSV, rows checked with their line and column,
//! completion in the parts' order, cancel), the direct variant, content
//! pages, CSV and JSON Lines exports, patch, delete, lists in both orders
//! with cursors, query templates, and isolation between projects and
//! accounts.

mod common;

use common::raw::*;
use common::*;
use hearth_server::AppState;
use serde_json::{json, Value};

// ---- helpers ----

fn text(reply: &Raw) -> String {
    String::from_utf8_lossy(&reply.bytes).to_string()
}

/// A request with a JSON body (`Some`) or none.
async fn call(state: &AppState, method: &str, uri: &str, key: &str, body: Option<Value>) -> Raw {
    match body {
        Some(body) => {
            request(
                state,
                method,
                uri,
                Some(key),
                Some("application/json"),
                body.to_string().into_bytes(),
            )
            .await
        }
        None => request(state, method, uri, Some(key), None, Vec::new()).await,
    }
}

/// Asserts 200 and gives the JSON body.
fn ok(reply: &Raw) -> Value {
    assert_eq!(reply.status, 200, "{}", text(reply));
    reply.json()
}

/// Asserts a 400 shape B and gives its `error` object.
fn shape_b(reply: &Raw) -> Value {
    assert_eq!(reply.status, 400, "{}", text(reply));
    let body = reply.json();
    let error = body["error"].clone();
    assert!(error["message"].is_string(), "shape B: {body}");
    error
}

/// The message of a 400 shape B.
fn message_400(reply: &Raw) -> String {
    shape_b(reply)["message"].as_str().unwrap().to_string()
}

fn schema_of(columns: &[(&str, &str)]) -> Value {
    Value::Array(
        columns
            .iter()
            .map(|(name, ty)| json!({"name": name, "type": {"name": ty}}))
            .collect(),
    )
}

/// A column of each type.
fn full_schema() -> Value {
    schema_of(&[
        ("prompt", "string"),
        ("count", "integer"),
        ("score", "float"),
        ("ok", "boolean"),
        ("meta", "json"),
    ])
}

async fn create_upload(state: &AppState, key: &str, uri: &str, body: Value) -> Value {
    ok(&call(state, "POST", uri, key, Some(body)).await)
}

async fn add_part(state: &AppState, key: &str, upload: &str, file_name: &str, data: &[u8]) -> Raw {
    add_part_at(
        state,
        key,
        &format!("/v1/datasets/uploads/{upload}/parts"),
        file_name,
        data,
    )
    .await
}

async fn add_part_at(state: &AppState, key: &str, uri: &str, file_name: &str, data: &[u8]) -> Raw {
    let body = form(&[("data", Some(file_name), data)]);
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    request(state, "POST", uri, Some(key), Some(&ct), body).await
}

/// Adds a part that must be accepted; its id, after checking the record.
async fn part_ok(
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

async fn complete(state: &AppState, key: &str, upload: &str, part_ids: &[&str]) -> Raw {
    call(
        state,
        "POST",
        &format!("/v1/datasets/uploads/{upload}/complete"),
        key,
        Some(json!({ "part_ids": part_ids })),
    )
    .await
}

async fn cancel(state: &AppState, key: &str, upload: &str) -> Raw {
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
async fn create_direct(state: &AppState, body: Value) -> Value {
    let dataset = ok(&call(state, "POST", "/v1/datasets", KEY, Some(body)).await);
    assert!(
        dataset["id"].as_str().unwrap().starts_with("dataset-"),
        "{dataset}"
    );
    assert_eq!(dataset["object"], "dataset");
    dataset
}

fn id_of(value: &Value) -> String {
    value["id"].as_str().expect("an id").to_string()
}

async fn get_dataset(state: &AppState, id: &str) -> Value {
    ok(&get(state, &format!("/v1/datasets/{id}"), Some(KEY)).await)
}

async fn content(state: &AppState, id: &str, query: &str) -> Raw {
    get(
        state,
        &format!("/v1/datasets/{id}/content{query}"),
        Some(KEY),
    )
    .await
}

async fn export(state: &AppState, id: &str, query: &str) -> Raw {
    get(
        state,
        &format!("/v1/datasets/{id}/export{query}"),
        Some(KEY),
    )
    .await
}

fn content_type(reply: &Raw) -> String {
    reply
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// RFC 4180 records: quoted cells with doubled quotes, line breaks inside
/// quotes, records ended by CRLF or LF.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
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
fn indices(page: &Value) -> Vec<i64> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["i"].as_i64().unwrap())
        .collect()
}

/// A key whose account reaches the default project and a second project
/// `a`; returns (key, a).
async fn two_project_key(state: &AppState) -> (String, String) {
    let store = &state.store;
    let a = store.create_project("A").await.unwrap().id;
    let key = store
        .create_key("two", Some(&state.default_project), false)
        .await
        .unwrap();
    store.grant_project(&key.info.account_id, &a).await.unwrap();
    (key.secret, a)
}

// ---- the rows of the upload flow ----

const JSONL_PART: &str = concat!(
    r#"{"prompt": "hello", "count": 1, "score": 0.5, "ok": true, "meta": {"a": {"b": [1, 2]}, "c": null}}"#,
    "\n",
    r#"{"prompt": null, "count": -7, "score": 2, "ok": false, "meta": [1, "x", {"y": false}]}"#,
    "\n",
    r#"{"count": null, "score": null, "ok": null, "meta": null}"#,
    "\n",
);

/// The CSV header in another order than the schema; the first row's
/// `prompt` holds a comma, quotes and a line break.
const CSV_PART: &str = concat!(
    "count,prompt,meta,score,ok\r\n",
    "42,\"He said \"\"hi\"\", then\nleft\",\"{\"\"k\"\": {\"\"deep\"\": [true, null]}}\",3.25,TRUE\r\n",
    "0,,,,false\r\n",
    ",plain,\"\"\"s\"\"\",-1.5,\r\n",
);

fn jsonl_rows() -> Vec<Value> {
    vec![
        json!({"prompt": "hello", "count": 1, "score": 0.5, "ok": true,
               "meta": {"a": {"b": [1, 2]}, "c": null}}),
        json!({"prompt": null, "count": -7, "score": 2.0, "ok": false,
               "meta": [1, "x", {"y": false}]}),
        json!({"prompt": null, "count": null, "score": null, "ok": null, "meta": null}),
    ]
}

fn csv_rows() -> Vec<Value> {
    vec![
        json!({"prompt": "He said \"hi\", then\nleft", "count": 42, "score": 3.25, "ok": true,
               "meta": {"k": {"deep": [true, null]}}}),
        json!({"prompt": null, "count": 0, "score": null, "ok": false, "meta": null}),
        json!({"prompt": "plain", "count": null, "score": -1.5, "ok": null, "meta": "s"}),
    ]
}

// ---- 1. the upload flow ----

#[tokio::test]
async fn an_upload_in_two_parts_makes_a_dataset_in_the_parts_order() {
    let state = bare_state();
    let project = state.default_project.to_string();
    let schema = full_schema();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "mixed", "folder": "evals/2024", "description": "two parts",
               "schema": schema}),
    )
    .await;
    let upload_id = id_of(&upload);
    assert!(upload_id.starts_with("dsupload-"), "{upload}");
    assert_eq!(upload["object"], "dataset.upload");
    let info = &upload["upload_info"];
    assert_eq!(info["status"], "PENDING", "{upload}");
    assert_eq!(
        info["dataset"],
        json!({"name": "mixed", "schema": schema, "folder": "evals/2024", "id": null})
    );
    assert!(info["created_at"].is_i64(), "{upload}");
    assert!(
        info["completed_at"].is_null() && info["error"].is_null(),
        "{upload}"
    );
    assert_eq!(info["ai_project_id"], project.as_str());

    let jsonl = part_ok(&state, &upload_id, "rows.jsonl", JSONL_PART.as_bytes(), 3).await;
    let csv = part_ok(&state, &upload_id, "rows.csv", CSV_PART.as_bytes(), 3).await;

    let done = ok(&complete(&state, KEY, &upload_id, &[&jsonl, &csv]).await);
    assert_eq!(done["id"], upload_id.as_str());
    let info = &done["upload_info"];
    assert_eq!(info["status"], "COMPLETED", "{done}");
    assert!(info["completed_at"].is_i64(), "{done}");
    assert!(info["error"].is_null(), "{done}");
    let dataset_id = info["dataset"]["id"]
        .as_str()
        .expect("a dataset id")
        .to_string();
    assert!(dataset_id.starts_with("dataset-"), "{done}");
    assert_eq!(info["dataset"]["name"], "mixed");
    assert_eq!(info["dataset"]["schema"], schema);

    let dataset = get_dataset(&state, &dataset_id).await;
    assert_eq!(dataset["id"], dataset_id.as_str());
    assert_eq!(dataset["object"], "dataset");
    assert_eq!(dataset["name"], "mixed");
    assert_eq!(dataset["folder"], "evals/2024");
    assert_eq!(dataset["description"], "two parts");
    assert_eq!(dataset["schema"], schema);
    assert_eq!(dataset["row_count"], 6);
    assert!(dataset["bytes"].as_i64().unwrap() > 0, "{dataset}");
    assert!(dataset["created_at"].is_i64() && dataset["updated_at"].is_i64());
    assert_eq!(dataset["ai_project_id"], project.as_str());

    let page = ok(&content(&state, &dataset_id, "").await);
    assert_eq!(page["object"], "list");
    let expected: Vec<Value> = jsonl_rows().into_iter().chain(csv_rows()).collect();
    assert_eq!(page["data"], Value::Array(expected.clone()), "{page}");
    assert_eq!(page["total"], 6);
    assert_eq!(page["offset"], 0);

    // Completing again with the same list: the same upload, the same dataset.
    let again = ok(&complete(&state, KEY, &upload_id, &[&jsonl, &csv]).await);
    assert_eq!(again["upload_info"]["status"], "COMPLETED");
    assert_eq!(again["upload_info"]["dataset"]["id"], dataset_id.as_str());
    let list = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");

    // The same parts completed the other way round: the rows reversed by part.
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "reversed", "schema": schema}),
    )
    .await;
    let second = id_of(&upload);
    assert!(upload["upload_info"]["dataset"]["folder"].is_null());
    let jsonl = part_ok(&state, &second, "rows.jsonl", JSONL_PART.as_bytes(), 3).await;
    let csv = part_ok(&state, &second, "rows.csv", CSV_PART.as_bytes(), 3).await;
    let done = ok(&complete(&state, KEY, &second, &[&csv, &jsonl]).await);
    let reversed_id = done["upload_info"]["dataset"]["id"].as_str().unwrap();
    assert_ne!(reversed_id, dataset_id);
    let page = ok(&content(&state, reversed_id, "").await);
    let expected: Vec<Value> = csv_rows().into_iter().chain(jsonl_rows()).collect();
    assert_eq!(page["data"], Value::Array(expected), "{page}");
    assert_eq!(get_dataset(&state, reversed_id).await["row_count"], 6);
}

#[tokio::test]
async fn a_subset_of_the_parts_makes_the_dataset_and_unknown_parts_are_named() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "subset", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    let jsonl = part_ok(&state, &upload_id, "a.jsonl", JSONL_PART.as_bytes(), 3).await;
    let csv = part_ok(&state, &upload_id, "b.csv", CSV_PART.as_bytes(), 3).await;
    assert_ne!(jsonl, csv);

    // A part id that is not of this upload: 400 naming it; still PENDING.
    let other = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "other", "schema": full_schema()}),
    )
    .await;
    let foreign = part_ok(&state, &id_of(&other), "c.jsonl", JSONL_PART.as_bytes(), 3).await;
    let message = message_400(&complete(&state, KEY, &upload_id, &[&csv, &foreign]).await);
    assert!(message.contains(&foreign), "{message}");

    let done = ok(&complete(&state, KEY, &upload_id, &[&csv]).await);
    let dataset_id = done["upload_info"]["dataset"]["id"].as_str().unwrap();
    let dataset = get_dataset(&state, dataset_id).await;
    assert_eq!(dataset["row_count"], 3);
    assert_eq!(
        ok(&content(&state, dataset_id, "").await)["data"],
        Value::Array(csv_rows())
    );
}

// ---- 2. rows checked ----

#[tokio::test]
async fn bad_rows_are_refused_with_their_line_and_column() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "checked", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    let first = part_ok(
        &state,
        &upload_id,
        "first.jsonl",
        br#"{"prompt": "first", "count": 1}"#,
        1,
    )
    .await;

    // JSON Lines: a string where a float goes, on line 3.
    let bad = concat!(
        r#"{"prompt": "a", "score": 1.5}"#,
        "\n",
        r#"{"prompt": "b", "score": 2}"#,
        "\n",
        r#"{"prompt": "c", "score": "high"}"#,
        "\n",
        r#"{"prompt": "d", "score": 3}"#,
        "\n",
    );
    let message =
        message_400(&add_part(&state, KEY, &upload_id, "bad.jsonl", bad.as_bytes()).await);
    assert!(
        message.contains("line 3") && message.contains("score"),
        "{message}"
    );

    // CSV: a bad integer on the second data row (line 3, the header being 1);
    // CRLF line ends have a test of their own below.
    let bad = "prompt,count\na,1\nb,x12\nc,3\n";
    let message = message_400(&add_part(&state, KEY, &upload_id, "bad.csv", bad.as_bytes()).await);
    assert!(
        message.contains("line 3") && message.contains("count"),
        "{message}"
    );

    // A key that is not a column.
    let bad = concat!(r#"{"prompt": "a", "colour": "red"}"#, "\n");
    let message =
        message_400(&add_part(&state, KEY, &upload_id, "bad.jsonl", bad.as_bytes()).await);
    assert!(
        message.contains("line 1") && message.contains("colour"),
        "{message}"
    );

    // A line that is not an object.
    let bad = concat!(r#"{"prompt": "a"}"#, "\n", "[1, 2]", "\n");
    let message =
        message_400(&add_part(&state, KEY, &upload_id, "bad.jsonl", bad.as_bytes()).await);
    assert!(message.contains("line 2"), "{message}");
    let bad = concat!(
        r#"{"prompt": "a"}"#,
        "\n",
        r#"{"prompt": "b"}"#,
        "\n",
        "\"text\"\n"
    );
    let message =
        message_400(&add_part(&state, KEY, &upload_id, "bad.jsonl", bad.as_bytes()).await);
    assert!(message.contains("line 3"), "{message}");

    // Nothing lost: the upload is still PENDING and takes a good part.
    let last = part_ok(
        &state,
        &upload_id,
        "last.jsonl",
        br#"{"prompt": "last", "ok": true}"#,
        1,
    )
    .await;
    let done = ok(&complete(&state, KEY, &upload_id, &[&first, &last]).await);
    assert_eq!(done["upload_info"]["status"], "COMPLETED");
    let dataset_id = done["upload_info"]["dataset"]["id"].as_str().unwrap();
    assert_eq!(get_dataset(&state, dataset_id).await["row_count"], 2);
    assert_eq!(
        ok(&content(&state, dataset_id, "").await)["data"],
        json!([
            {"prompt": "first", "count": 1, "score": null, "ok": null, "meta": null},
            {"prompt": "last", "count": null, "score": null, "ok": true, "meta": null},
        ])
    );
}

/// A part form without its `data` field: 422 shape C at `["body", "data"]`,
/// as `/v1/files` answers a form without `file`.
#[tokio::test]
async fn a_part_without_data_is_422() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "no data", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    let body = form(&[("file", Some("rows.jsonl"), br#"{"prompt": "a"}"#)]);
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let reply = request(
        &state,
        "POST",
        &format!("/v1/datasets/uploads/{upload_id}/parts"),
        Some(KEY),
        Some(&ct),
        body,
    )
    .await;
    assert_eq!(
        reply.status,
        422,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let v: Value = serde_json::from_slice(&reply.bytes).unwrap();
    assert_eq!(v["detail"][0]["loc"], json!(["body", "data"]));
}

/// CSV with the line ends RFC 4180 names (CRLF): the same line numbers as
/// with LF, a quoted cell spanning lines counting them.
#[tokio::test]
async fn csv_line_numbers_count_crlf_line_ends() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "crlf", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    let cases = [
        // The second data row: line 3.
        ("prompt,count\r\na,1\r\nb,x12\r\nc,3\r\n", "line 3"),
        // The first data row: line 2.
        ("prompt,count\r\na,x1\r\n", "line 2"),
        // A first row over lines 2 and 3, the bad one on line 4.
        ("prompt,count\r\n\"a\r\nb\",1\r\nc,x\r\n", "line 4"),
    ];
    let mut wrong = Vec::new();
    for (bad, line) in cases {
        let reply = add_part(&state, KEY, &upload_id, "bad.csv", bad.as_bytes()).await;
        let message = message_400(&reply);
        if !(message.contains(line) && message.contains("count")) {
            wrong.push(format!("{bad:?}: expected {line}, got: {message}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn bad_schemas_and_bad_direct_rows_are_400() {
    let state = bare_state();
    let uri = "/v1/datasets/uploads";
    let reply = call(
        &state,
        "POST",
        uri,
        KEY,
        Some(json!({"name": "x", "schema": []})),
    )
    .await;
    assert_eq!(shape_b(&reply)["param"], "schema");
    let twice = schema_of(&[("a", "string"), ("a", "integer")]);
    let reply = call(
        &state,
        "POST",
        uri,
        KEY,
        Some(json!({"name": "x", "schema": twice})),
    )
    .await;
    let error = shape_b(&reply);
    assert_eq!(error["param"], "schema");
    assert!(error["message"].as_str().unwrap().contains('a'), "{error}");
    let date = schema_of(&[("when", "date")]);
    let reply = call(
        &state,
        "POST",
        uri,
        KEY,
        Some(json!({"name": "x", "schema": date})),
    )
    .await;
    let error = shape_b(&reply);
    assert_eq!(error["param"], "schema");
    assert!(
        error["message"].as_str().unwrap().contains("date"),
        "{error}"
    );
    let reply = call(
        &state,
        "POST",
        uri,
        KEY,
        Some(json!({"schema": full_schema()})),
    )
    .await;
    assert!(
        reply.status == 400 || reply.status == 422,
        "{}: {}",
        reply.status,
        text(&reply)
    );
    // Unparseable JSON: 422.
    let reply = request(
        &state,
        "POST",
        uri,
        Some(KEY),
        Some("application/json"),
        b"{\"name\": ".to_vec(),
    )
    .await;
    shape_c(&reply);

    // The direct variant checks its rows too.
    let reply = call(
        &state,
        "POST",
        "/v1/datasets",
        KEY,
        Some(json!({"name": "direct", "schema": full_schema(),
                    "rows": [{"prompt": "a", "count": 1}, {"prompt": "b", "count": "two"}]})),
    )
    .await;
    let message = message_400(&reply);
    assert!(message.contains("count"), "{message}");
    // Nothing was made.
    let list = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    assert_eq!(list["data"], json!([]), "{list}");
}

// ---- 3. cancel ----

#[tokio::test]
async fn a_cancelled_upload_takes_nothing_more_and_a_completed_one_cannot_be_cancelled() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "dropped", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    let part = part_ok(&state, &upload_id, "a.jsonl", JSONL_PART.as_bytes(), 3).await;
    let cancelled = ok(&cancel(&state, KEY, &upload_id).await);
    assert_eq!(cancelled["id"], upload_id.as_str());
    assert_eq!(
        cancelled["upload_info"]["status"], "CANCELLED",
        "{cancelled}"
    );
    assert!(cancelled["upload_info"]["dataset"]["id"].is_null());

    shape_a(
        &add_part(&state, KEY, &upload_id, "b.jsonl", JSONL_PART.as_bytes()).await,
        409,
    );
    shape_a(&complete(&state, KEY, &upload_id, &[&part]).await, 409);
    let list = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    assert_eq!(list["data"], json!([]), "{list}");

    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "kept", "schema": full_schema()}),
    )
    .await;
    let kept = id_of(&upload);
    let part = part_ok(&state, &kept, "a.csv", CSV_PART.as_bytes(), 3).await;
    let done = ok(&complete(&state, KEY, &kept, &[&part]).await);
    let dataset_id = done["upload_info"]["dataset"]["id"].as_str().unwrap();
    shape_a(&cancel(&state, KEY, &kept).await, 409);
    // Still completed, the dataset whole.
    let again = ok(&complete(&state, KEY, &kept, &[&part]).await);
    assert_eq!(again["upload_info"]["status"], "COMPLETED");
    assert_eq!(get_dataset(&state, dataset_id).await["row_count"], 3);
    // A completed upload takes no more parts.
    shape_a(
        &add_part(&state, KEY, &kept, "b.jsonl", JSONL_PART.as_bytes()).await,
        409,
    );
}

// ---- 4. content pages ----

#[tokio::test]
async fn content_pages_by_offset_and_limit() {
    let state = bare_state();
    let rows: Vec<Value> = (0..150)
        .map(|i| json!({"i": i, "label": format!("row {i}")}))
        .collect();
    let dataset = create_direct(&state, json!({"name": "numbers", "rows": rows})).await;
    let id = id_of(&dataset);
    assert_eq!(dataset["row_count"], 150);
    // Inferred from the rows.
    assert_eq!(
        dataset["schema"],
        schema_of(&[("i", "integer"), ("label", "string")])
    );

    let page = ok(&content(&state, &id, "").await);
    assert_eq!(indices(&page), (0..100).collect::<Vec<_>>());
    assert_eq!(
        (&page["offset"], &page["limit"], &page["total"]),
        (&json!(0), &json!(100), &json!(150))
    );
    assert_eq!(page["data"][7], json!({"i": 7, "label": "row 7"}));

    let page = ok(&content(&state, &id, "?limit=1").await);
    assert_eq!(page["data"], json!([{"i": 0, "label": "row 0"}]));
    assert_eq!((&page["limit"], &page["total"]), (&json!(1), &json!(150)));

    let page = ok(&content(&state, &id, "?limit=1000").await);
    assert_eq!(indices(&page), (0..150).collect::<Vec<_>>());
    assert_eq!(page["total"], 150);

    let page = ok(&content(&state, &id, "?offset=75&limit=10").await);
    assert_eq!(indices(&page), (75..85).collect::<Vec<_>>());
    assert_eq!(
        (&page["offset"], &page["limit"], &page["total"]),
        (&json!(75), &json!(10), &json!(150))
    );
    let page = ok(&content(&state, &id, "?offset=140&limit=50").await);
    assert_eq!(indices(&page), (140..150).collect::<Vec<_>>());

    for offset in [150, 151, 100_000] {
        let page = ok(&content(&state, &id, &format!("?offset={offset}")).await);
        assert_eq!(page["data"], json!([]), "{page}");
        assert_eq!(page["total"], 150);
        assert_eq!(page["offset"], offset);
    }

    for query in ["?limit=0", "?limit=1001", "?limit=-5"] {
        let item = shape_c(&content(&state, &id, query).await);
        assert_eq!(item["loc"], json!(["query", "limit"]), "{query}: {item}");
    }
    let item = shape_c(&content(&state, &id, "?offset=-1").await);
    assert_eq!(item["loc"], json!(["query", "offset"]), "{item}");
}

// ---- 5. export ----

fn export_rows() -> Vec<Value> {
    vec![
        json!({"prompt": "plain", "count": 1, "score": 0.5, "ok": true, "meta": {"a": 1}}),
        json!({"prompt": "He said \"hi\", then\nleft", "count": 2, "score": null, "ok": false,
               "meta": null}),
        json!({"prompt": null, "count": 3, "score": 1.25, "ok": null, "meta": [1, "x"]}),
    ]
}

async fn export_dataset(state: &AppState) -> String {
    let dataset = create_direct(
        state,
        json!({"name": "export me", "schema": full_schema(), "rows": export_rows()}),
    )
    .await;
    assert_eq!(dataset["row_count"], 3);
    id_of(&dataset)
}

/// A `meta` cell: empty for null, else JSON text equal to `expected`.
fn assert_json_cell(cell: &str, expected: &Value) {
    if expected.is_null() {
        assert_eq!(cell, "");
    } else {
        let got: Value =
            serde_json::from_str(cell).unwrap_or_else(|e| panic!("not JSON ({e}): {cell:?}"));
        assert_eq!(&got, expected);
    }
}

#[tokio::test]
async fn exports_as_csv() {
    let state = bare_state();
    let id = export_dataset(&state).await;

    let reply = export(&state, &id, "?format=csv").await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert!(
        content_type(&reply).starts_with("text/csv"),
        "{:?}",
        reply.headers
    );
    let body = text(&reply);
    assert!(
        body.starts_with("prompt,count,score,ok,meta\r\n")
            || body.starts_with("prompt,count,score,ok,meta\n"),
        "{body:?}"
    );
    // The cell with a comma, quotes and a line break, quoted as RFC 4180 says.
    assert!(
        body.contains("\"He said \"\"hi\"\", then\nleft\""),
        "{body:?}"
    );
    let records = parse_csv(&body);
    assert_eq!(records.len(), 4, "{body:?}");
    assert_eq!(records[0], ["prompt", "count", "score", "ok", "meta"]);
    assert_eq!(records[1][..4], ["plain", "1", "0.5", "true"]);
    assert_eq!(
        records[2][..4],
        ["He said \"hi\", then\nleft", "2", "", "false"]
    );
    assert_eq!(records[3][..4], ["", "3", "1.25", ""]);
    for (record, row) in records[1..].iter().zip(export_rows()) {
        assert_eq!(record.len(), 5, "{record:?}");
        assert_json_cell(&record[4], &row["meta"]);
    }

    // Some columns, in the order asked, and a limit.
    let reply = export(&state, &id, "?format=csv&columns=ok,prompt&limit=2").await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(
        parse_csv(&text(&reply)),
        [
            vec!["ok", "prompt"],
            vec!["true", "plain"],
            vec!["false", "He said \"hi\", then\nleft"],
        ]
    );
    let reply = export(&state, &id, "?format=csv&columns=meta,count").await;
    let records = parse_csv(&text(&reply));
    assert_eq!(records.len(), 4, "{}", text(&reply));
    assert_eq!(records[0], ["meta", "count"]);
    for ((record, row), count) in records[1..].iter().zip(export_rows()).zip(["1", "2", "3"]) {
        assert_json_cell(&record[0], &row["meta"]);
        assert_eq!(record[1], count);
    }
    let reply = export(&state, &id, "?format=csv&limit=1").await;
    let records = parse_csv(&text(&reply));
    assert_eq!(records.len(), 2, "{}", text(&reply));
    assert_eq!(records[1][0], "plain");
}

#[tokio::test]
async fn exports_as_json_lines() {
    let state = bare_state();
    let id = export_dataset(&state).await;

    let reply = export(&state, &id, "?format=jsonl").await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert!(
        content_type(&reply).starts_with("application/jsonl"),
        "{:?}",
        reply.headers
    );
    let body = text(&reply);
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 3, "{body:?}");
    for (line, row) in lines.iter().zip(export_rows()) {
        let got: Value = serde_json::from_str(line).unwrap();
        assert_eq!(got, row);
    }
    // The schema's order within a line.
    let at = |key: &str| lines[0].find(&format!("\"{key}\"")).unwrap();
    assert!(
        at("prompt") < at("count")
            && at("count") < at("score")
            && at("score") < at("ok")
            && at("ok") < at("meta"),
        "{}",
        lines[0]
    );

    let reply = export(&state, &id, "?format=jsonl&columns=count,prompt&limit=2").await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    let body = text(&reply);
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 2, "{body:?}");
    assert!(lines[0].starts_with("{\"count\""), "{body:?}");
    assert_eq!(
        serde_json::from_str::<Value>(lines[0]).unwrap(),
        json!({"count": 1, "prompt": "plain"})
    );
    assert_eq!(
        serde_json::from_str::<Value>(lines[1]).unwrap(),
        json!({"count": 2, "prompt": "He said \"hi\", then\nleft"})
    );
}

#[tokio::test]
async fn export_errors() {
    let state = bare_state();
    let id = export_dataset(&state).await;
    for format in ["csv", "jsonl"] {
        let reply = export(
            &state,
            &id,
            &format!("?format={format}&columns=prompt,nope"),
        )
        .await;
        let message = message_400(&reply);
        assert!(message.contains("nope"), "{message}");
    }
    let item = shape_c(&export(&state, &id, "").await);
    assert_eq!(item["loc"], json!(["query", "format"]), "{item}");
    shape_c(&export(&state, &id, "?columns=prompt").await);
    let reply = export(&state, &id, "?format=xml").await;
    assert!(
        reply.status == 400 || reply.status == 422,
        "{}: {}",
        reply.status,
        text(&reply)
    );
}

// ---- 6. patch ----

#[tokio::test]
async fn patch_changes_only_the_descriptive_fields() {
    let state = bare_state();
    let dataset = create_direct(
        &state,
        json!({"name": "original", "folder": "a", "description": "first words",
               "schema": full_schema(), "rows": export_rows()}),
    )
    .await;
    let id = id_of(&dataset);
    assert_eq!(
        (&dataset["folder"], &dataset["description"]),
        (&json!("a"), &json!("first words"))
    );

    let uri = format!("/v1/datasets/{id}");
    let patched = ok(&call(
        &state,
        "PATCH",
        &uri,
        KEY,
        Some(json!({"name": "renamed", "folder": "b/c", "description": "new words"})),
    )
    .await);
    assert_eq!(patched["id"], id.as_str());
    assert_eq!(patched["name"], "renamed");
    assert_eq!(patched["folder"], "b/c");
    assert_eq!(patched["description"], "new words");
    for field in [
        "schema",
        "row_count",
        "bytes",
        "created_at",
        "ai_project_id",
    ] {
        assert_eq!(patched[field], dataset[field], "{field}");
    }
    assert!(patched["updated_at"].as_i64() >= dataset["updated_at"].as_i64());
    assert_eq!(get_dataset(&state, &id).await, patched);

    // Only the name.
    let renamed = ok(&call(&state, "PATCH", &uri, KEY, Some(json!({"name": "again"}))).await);
    assert_eq!(renamed["name"], "again");
    assert_eq!(renamed["folder"], "b/c");
    assert_eq!(renamed["description"], "new words");

    // Other fields: 400 naming them, and nothing changes.
    let refused = [
        json!({"schema": schema_of(&[("x", "string")])}),
        json!({"name": "sneaky", "row_count": 99}),
        json!({"description": "sneaky", "schema": []}),
    ];
    for (body, field) in refused.into_iter().zip(["schema", "row_count", "schema"]) {
        let reply = call(&state, "PATCH", &uri, KEY, Some(body)).await;
        let error = shape_b(&reply);
        assert_eq!(error["param"], field, "{error}");
        assert!(
            error["message"].as_str().unwrap().contains(field),
            "{error}"
        );
    }
    let now = get_dataset(&state, &id).await;
    assert_eq!(now, renamed);
    assert_eq!(now["row_count"], 3);
    assert_eq!(now["schema"], full_schema());
    assert_eq!(
        ok(&content(&state, &id, "").await)["data"],
        Value::Array(export_rows())
    );
}

// ---- 7. delete ----

#[tokio::test]
async fn a_deleted_dataset_is_gone() {
    let state = bare_state();
    let keep = id_of(&create_direct(&state, json!({"name": "keep", "rows": [{"x": 1}]})).await);
    let id = id_of(&create_direct(&state, json!({"name": "drop", "rows": [{"x": 2}]})).await);
    let uri = format!("/v1/datasets/{id}");
    let deleted = ok(&call(&state, "DELETE", &uri, KEY, None).await);
    assert_eq!(
        deleted,
        json!({"id": id, "object": "dataset.deleted", "deleted": true})
    );
    shape_a(&get(&state, &uri, Some(KEY)).await, 403);
    shape_a(&content(&state, &id, "").await, 403);
    shape_a(&export(&state, &id, "?format=csv").await, 403);
    shape_a(
        &call(&state, "PATCH", &uri, KEY, Some(json!({"name": "back"}))).await,
        403,
    );
    shape_a(&call(&state, "DELETE", &uri, KEY, None).await, 403);
    let list = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["data"][0]["id"], keep.as_str());
    assert_eq!(get_dataset(&state, &keep).await["row_count"], 1);
}

// ---- 8. lists ----

/// Every id of the list in `query`'s order, by pages of two: checks each
/// page's `has_more`, `first_id` and `last_id`.
async fn all_pages(state: &AppState, query: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let cursor = after
            .as_ref()
            .map(|a| format!("&after={a}"))
            .unwrap_or_default();
        let page = ok(&get(
            state,
            &format!("/v1/datasets?limit=2&{query}{cursor}"),
            Some(KEY),
        )
        .await);
        assert_eq!(page["object"], "list");
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 2, "{page}");
        let page_ids: Vec<String> = data.iter().map(id_of).collect();
        assert_eq!(
            page["first_id"].as_str(),
            page_ids.first().map(String::as_str)
        );
        assert_eq!(
            page["last_id"].as_str(),
            page_ids.last().map(String::as_str)
        );
        ids.extend(page_ids);
        if page["has_more"] == false {
            return ids;
        }
        assert_eq!(page["has_more"], true, "{page}");
        assert_eq!(data.len(), 2, "{page}");
        after = Some(page["last_id"].as_str().unwrap().to_string());
    }
    panic!("more pages than datasets: {ids:?}");
}

#[tokio::test]
async fn lists_sort_by_name_and_date_both_ways_and_page_with_after() {
    let state = bare_state();
    let empty = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    assert_eq!(
        empty,
        json!({"object": "list", "data": [], "has_more": false, "first_id": null, "last_id": null})
    );

    let names = ["delta", "alpha", "echo", "charlie", "bravo"];
    let mut created = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let dataset = create_direct(&state, json!({"name": name, "rows": [{"n": i}]})).await;
        created.push(id_of(&dataset));
    }
    let by_name = |order: &[&str]| -> Vec<String> {
        order
            .iter()
            .map(|n| created[names.iter().position(|m| m == n).unwrap()].clone())
            .collect()
    };
    let name_asc = by_name(&["alpha", "bravo", "charlie", "delta", "echo"]);
    let mut name_desc = name_asc.clone();
    name_desc.reverse();
    let date_asc = created.clone();
    let mut date_desc = created.clone();
    date_desc.reverse();

    assert_eq!(
        all_pages(&state, "sort_by=name&sort_order=asc").await,
        name_asc
    );
    assert_eq!(
        all_pages(&state, "sort_by=name&sort_order=desc").await,
        name_desc
    );
    assert_eq!(
        all_pages(&state, "sort_by=created_at&sort_order=asc").await,
        date_asc
    );
    assert_eq!(
        all_pages(&state, "sort_by=created_at&sort_order=desc").await,
        date_desc
    );
    // The defaults: created_at, newest first.
    assert_eq!(all_pages(&state, "").await, date_desc);
    let whole = ok(&get(&state, "/v1/datasets", Some(KEY)).await);
    let ids: Vec<String> = whole["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(ids, date_desc);
    assert_eq!(whole["has_more"], false);
    assert_eq!(whole["data"][0]["name"], "bravo");
    assert_eq!(whole["data"][0]["row_count"], 1);

    let item = shape_c(&get(&state, "/v1/datasets?sort_by=size", Some(KEY)).await);
    assert_eq!(item["loc"], json!(["query", "sort_by"]), "{item}");
    let item = shape_c(&get(&state, "/v1/datasets?sort_order=sideways", Some(KEY)).await);
    assert_eq!(item["loc"], json!(["query", "sort_order"]), "{item}");
    for limit in ["0", "1001", "-1"] {
        let item = shape_c(&get(&state, &format!("/v1/datasets?limit={limit}"), Some(KEY)).await);
        assert_eq!(item["loc"], json!(["query", "limit"]), "{limit}: {item}");
    }
    let page = ok(&get(&state, "/v1/datasets?limit=1000", Some(KEY)).await);
    assert_eq!(page["data"].as_array().unwrap().len(), 5);
}

// ---- 9. isolation ----

#[tokio::test]
async fn another_projects_datasets_and_uploads_are_403() {
    let state = bare_state();
    // The owner: an account reaching the default project and project A;
    // the dataset and the uploads live in A.
    let (owner, a) = two_project_key(&state).await;
    let in_a = format!("?ai_project_id={a}");
    let dataset = ok(&call(
        &state,
        "POST",
        &format!("/v1/datasets{in_a}"),
        &owner,
        Some(json!({"name": "secret", "schema": full_schema(), "rows": export_rows()})),
    )
    .await);
    let dataset_id = id_of(&dataset);
    assert_eq!(dataset["ai_project_id"], a.as_str());
    let upload = create_upload(
        &state,
        &owner,
        &format!("/v1/datasets/uploads{in_a}"),
        json!({"name": "pending", "schema": full_schema()}),
    )
    .await;
    let upload_id = id_of(&upload);
    assert_eq!(upload["upload_info"]["ai_project_id"], a.as_str());
    let part = ok(&add_part_at(
        &state,
        &owner,
        &format!("/v1/datasets/uploads/{upload_id}/parts{in_a}"),
        "a.jsonl",
        JSONL_PART.as_bytes(),
    )
    .await);
    let part_id = id_of(&part);

    // A key of project B (another account), a key of another account on
    // the default project, and the server's key (the default project).
    let (b, key_b) = other_project(&state).await;
    let stranger = state
        .store
        .create_key("stranger", Some(&state.default_project), false)
        .await
        .unwrap()
        .secret;
    for key in [key_b.as_str(), stranger.as_str(), KEY] {
        let ds = format!("/v1/datasets/{dataset_id}");
        for path in [
            ds.clone(),
            format!("{ds}/content"),
            format!("{ds}/export?format=csv"),
            format!("{ds}/export?format=jsonl"),
            format!("{ds}/query_templates"),
        ] {
            let detail = shape_a(&get(&state, &path, Some(key)).await, 403);
            assert!(!detail.contains(&a), "{detail}");
        }
        shape_a(
            &call(&state, "PATCH", &ds, key, Some(json!({"name": "mine"}))).await,
            403,
        );
        shape_a(&call(&state, "DELETE", &ds, key, None).await, 403);
        shape_a(
            &add_part(&state, key, &upload_id, "b.jsonl", JSONL_PART.as_bytes()).await,
            403,
        );
        shape_a(&complete(&state, key, &upload_id, &[&part_id]).await, 403);
        shape_a(&cancel(&state, key, &upload_id).await, 403);
        // Not in their lists.
        let list = ok(&get(&state, "/v1/datasets", Some(key)).await);
        assert_eq!(list["data"], json!([]), "{list}");
        // Ids that do not exist: 403 alike.
        shape_a(
            &get(
                &state,
                "/v1/datasets/dataset-01J00000000000000000000000",
                Some(key),
            )
            .await,
            403,
        );
        shape_a(
            &add_part(
                &state,
                key,
                "dsupload-01J00000000000000000000000",
                "b.jsonl",
                JSONL_PART.as_bytes(),
            )
            .await,
            403,
        );
    }
    let list = ok(&get(
        &state,
        &format!("/v1/datasets?ai_project_id={b}"),
        Some(&key_b),
    )
    .await);
    assert_eq!(list["data"], json!([]), "{list}");
    // Naming project A is refused to the others.
    shape_a(
        &get(&state, &format!("/v1/datasets{in_a}"), Some(&key_b)).await,
        403,
    );
    // The owner's default project does not list it either.
    let list = ok(&get(&state, "/v1/datasets", Some(&owner)).await);
    assert_eq!(list["data"], json!([]), "{list}");

    // Untouched: the owner still reads, patches and completes.
    let list = ok(&get(&state, &format!("/v1/datasets{in_a}"), Some(&owner)).await);
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["data"][0]["id"], dataset_id.as_str());
    assert_eq!(list["data"][0]["name"], "secret");
    let got = ok(&get(
        &state,
        &format!("/v1/datasets/{dataset_id}{in_a}"),
        Some(&owner),
    )
    .await);
    assert_eq!(got["row_count"], 3);
    let page = ok(&get(
        &state,
        &format!("/v1/datasets/{dataset_id}/content{in_a}"),
        Some(&owner),
    )
    .await);
    assert_eq!(page["data"], Value::Array(export_rows()));
    let done = ok(&call(
        &state,
        "POST",
        &format!("/v1/datasets/uploads/{upload_id}/complete{in_a}"),
        &owner,
        Some(json!({"part_ids": [part_id]})),
    )
    .await);
    assert_eq!(done["upload_info"]["status"], "COMPLETED", "{done}");
}

// ---- 10. query templates ----

#[tokio::test]
async fn query_templates_name_every_column() {
    let state = bare_state();
    let id = export_dataset(&state).await;
    let reply = get(
        &state,
        &format!("/v1/datasets/{id}/query_templates"),
        Some(KEY),
    )
    .await;
    let body = ok(&reply);
    assert_eq!(body["object"], "dataset.query_templates");
    assert_eq!(body["dataset_id"], id.as_str());
    let templates = body["templates"].as_array().unwrap();
    assert!(!templates.is_empty(), "{body}");
    for template in templates {
        for field in ["name", "description", "query"] {
            assert!(
                template[field].as_str().is_some_and(|s| !s.is_empty()),
                "{field}: {template}"
            );
        }
    }
    let columns = ["prompt", "count", "score", "ok", "meta"];
    assert!(
        templates.iter().any(|t| {
            let query = t["query"].as_str().unwrap();
            columns.iter().all(|c| query.contains(c))
        }),
        "no query names every column: {body}"
    );
    assert!(
        templates
            .iter()
            .any(|t| t["query"].as_str().unwrap().contains("export")),
        "no export URL: {body}"
    );
}

/// Parts larger than the default request-body limit stream through;
/// the upload limit (`--max-upload-mb`) is 413 and `--dataset-max-parts`
/// is 409, each leaving the upload usable.
#[tokio::test]
async fn large_parts_stream_and_limits_hold() {
    let mut state = bare_state();
    state.max_upload_bytes = 6 * 1024 * 1024;
    state.datasets.max_parts = 2;
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "big", "schema": [{"name": "text", "type": {"name": "string"}}]}),
    )
    .await;
    let upload_id = id_of(&upload);
    // About 4 MB: over the 2 MB default of a request body, under the limit.
    let row = format!("{{\"text\": \"{}\"}}\n", "x".repeat(100));
    let rows = 40_000;
    let big = row.repeat(rows);
    assert!(big.len() > 4_000_000);
    let first = part_ok(&state, &upload_id, "big.jsonl", big.as_bytes(), rows as i64).await;
    // Over the upload limit: 413, nothing kept.
    let huge = row.repeat(70_000);
    let reply = add_part(&state, KEY, &upload_id, "huge.jsonl", huge.as_bytes()).await;
    assert_eq!(
        reply.status,
        413,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    // The second part is the last one allowed.
    let second = part_ok(&state, &upload_id, "small.jsonl", row.as_bytes(), 1).await;
    let reply = add_part(&state, KEY, &upload_id, "third.jsonl", row.as_bytes()).await;
    assert_eq!(
        reply.status,
        409,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let done = ok(&call(
        &state,
        "POST",
        &format!("/v1/datasets/uploads/{upload_id}/complete"),
        KEY,
        Some(json!({"part_ids": [first, second]})),
    )
    .await);
    let dataset = done["upload_info"]["dataset"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let got = ok(&call(&state, "GET", &format!("/v1/datasets/{dataset}"), KEY, None).await);
    assert_eq!(got["row_count"], rows as i64 + 1);
}

/// Polls an upload until it is no longer `PENDING`; its record.
async fn settled(state: &AppState, upload_id: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let record = ok(&call(
            state,
            "GET",
            &format!("/v1/datasets/uploads/{upload_id}"),
            KEY,
            None,
        )
        .await);
        if record["upload_info"]["status"] != "PENDING" {
            return record;
        }
        assert!(
            start.elapsed().as_secs() < 60,
            "import still pending: {record}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Imports from object storage (`file://` here; `s3://` goes through the
/// same object_store path): only under an allowed prefix, answered with a
/// `PENDING` upload record that ends `COMPLETED` with the dataset, or
/// `FAILED` with what went wrong.
#[tokio::test]
async fn imports_read_allowed_objects_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let allowed = format!("file://{}/", root.display());
    std::fs::write(
        root.join("rows.jsonl"),
        "{\"q\": \"a\", \"n\": 1}\n{\"q\": \"b\", \"n\": 2}\n",
    )
    .unwrap();
    std::fs::write(root.join("rows.csv"), "q,n\nc,3\nd,x\n").unwrap();

    // Off by default.
    let state = bare_state();
    let body = json!({"name": "imp", "source": {"type": "object_storage", "url": format!("{allowed}rows.jsonl")}});
    let reply = call(&state, "POST", "/v1/datasets", KEY, Some(body.clone())).await;
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    assert_eq!(reply.json()["error"]["param"], "source.url");

    let mut state = bare_state();
    state.datasets.import_allow = vec![allowed.clone()].into();
    // Schema inferred, in the background.
    let started = ok(&call(&state, "POST", "/v1/datasets", KEY, Some(body)).await);
    assert_eq!(started["object"], "dataset.upload", "{started}");
    let done = settled(&state, started["id"].as_str().unwrap()).await;
    assert_eq!(done["upload_info"]["status"], "COMPLETED", "{done}");
    let dataset = done["upload_info"]["dataset"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let content = ok(&call(
        &state,
        "GET",
        &format!("/v1/datasets/{dataset}/content"),
        KEY,
        None,
    )
    .await);
    assert_eq!(
        content["data"],
        json!([{"q": "a", "n": 1}, {"q": "b", "n": 2}])
    );
    let got = ok(&call(&state, "GET", &format!("/v1/datasets/{dataset}"), KEY, None).await);
    assert_eq!(
        got["schema"],
        json!([{"name": "q", "type": {"name": "string"}}, {"name": "n", "type": {"name": "integer"}}])
    );
    assert_eq!(
        got["source"],
        json!({"type": "object_storage", "url": format!("{allowed}rows.jsonl"), "format": "jsonl"})
    );

    // A bad row fails the import with its line; a missing object too.
    let csv = json!({"name": "csv", "schema": [{"name": "q", "type": {"name": "string"}},
        {"name": "n", "type": {"name": "integer"}}],
        "source": {"type": "object_storage", "url": format!("{allowed}rows.csv"), "format": "csv"}});
    let started = ok(&call(&state, "POST", "/v1/datasets", KEY, Some(csv)).await);
    let failed = settled(&state, started["id"].as_str().unwrap()).await;
    assert_eq!(failed["upload_info"]["status"], "FAILED", "{failed}");
    let error = failed["upload_info"]["error"].as_str().unwrap();
    assert!(error.contains("line 3") && error.contains("`n`"), "{error}");
    let missing = json!({"name": "m", "source": {"type": "object_storage", "url": format!("{allowed}nope.jsonl")}});
    let started = ok(&call(&state, "POST", "/v1/datasets", KEY, Some(missing)).await);
    let failed = settled(&state, started["id"].as_str().unwrap()).await;
    assert_eq!(failed["upload_info"]["status"], "FAILED", "{failed}");
    assert!(
        failed["upload_info"]["error"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{failed}"
    );

    // Outside the allowed prefix, around it with `..`, or another scheme: 400 at once.
    for url in [
        "file:///etc/passwd".to_string(),
        format!("{allowed}../outside.jsonl"),
        format!("{allowed}sub/%2e%2e/%2e%2e/x.jsonl"),
        "http://example.com/x.jsonl".to_string(),
    ] {
        let body = json!({"name": "x", "source": {"type": "object_storage", "url": url}});
        let reply = call(&state, "POST", "/v1/datasets", KEY, Some(body)).await;
        assert_eq!(
            reply.status,
            400,
            "{url}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
    }
}
