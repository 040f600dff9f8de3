//! `/v1/datasets` through the in-process router (no model needed):
//! content pages, CSV and JSON Lines exports, patch, delete, lists in both
//! orders with cursors, query templates, and isolation between projects
//! and accounts.

mod common;
mod datasets_common;

use common::raw::*;
use common::*;
use datasets_common::*;
use hearth_server::AppState;
use serde_json::{json, Value};

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
