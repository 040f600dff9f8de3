//! `/v1/datasets/uploads` through the in-process router (no model
//! needed): uploads in parts (JSON Lines and CSV, rows checked with their
//! line and column, completion in the parts' order, cancel), bad schemas
//! and direct rows, large parts and the upload limits.

mod common;
mod datasets_common;

use common::raw::*;
use common::*;
use datasets_common::*;
use serde_json::{json, Value};

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
