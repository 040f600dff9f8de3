//! `/v1/files` through the in-process router: every route, project
//! scoping, and every error (unknown id, another project's id, bad purpose,
//! missing fields, oversize, bad links).

mod common;

use axum::response::IntoResponse;
use common::raw::*;
use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};

#[tokio::test]
async fn upload_retrieve_list_content_and_delete() {
    let state = bare_state();
    let content = b"hello, files\n\x00\xff binary too";
    let file = upload(&state, "user_data", content).await;
    let id = file["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("file-"), "{file}");
    assert_eq!(file["object"], "file");
    assert_eq!(file["bytes"], content.len());
    assert_eq!(file["filename"], "data.jsonl");
    assert_eq!(file["purpose"], "user_data");
    assert_eq!(file["status"], "processed");
    assert!(
        file["status_details"].is_null() && file["created_at"].is_i64(),
        "{file}"
    );

    assert_eq!(
        get(&state, &format!("/v1/files/{id}"), Some(KEY))
            .await
            .json(),
        file
    );
    let list = get(&state, "/v1/files", Some(KEY)).await.json();
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"], json!([file]));
    assert_eq!(
        (list["first_id"].as_str(), list["last_id"].as_str()),
        (Some(id.as_str()), Some(id.as_str()))
    );
    assert_eq!(list["has_more"], false);

    let body = get(&state, &format!("/v1/files/{id}/content"), Some(KEY)).await;
    assert_eq!(body.status, 200);
    assert_eq!(body.bytes, content);
    assert_eq!(
        body.headers["content-length"],
        content.len().to_string().as_str()
    );

    let deleted = request(
        &state,
        "DELETE",
        &format!("/v1/files/{id}"),
        Some(KEY),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        deleted.json(),
        json!({"id": id, "object": "file", "deleted": true})
    );
    shape_a(
        &get(&state, &format!("/v1/files/{id}"), Some(KEY)).await,
        403,
    );
    assert!(state.store.blobs().file_ids().await.unwrap().is_empty());
}

#[tokio::test]
async fn jsonl_purposes_are_checked_line_by_line() {
    let state = bare_state();
    let good = upload(
        &state,
        "fine-tune",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    )
    .await;
    assert_eq!(good["status"], "processed");
    let bad_bytes = b"{\"custom_id\": \"1\"}\n{\"custom_id\": 2,}\n{}\n";
    let bad = upload(&state, "batch", bad_bytes).await;
    assert_eq!(bad["status"], "error");
    let details = bad["status_details"].as_str().unwrap();
    assert!(details.starts_with("line 2"), "{details}");
    assert_eq!(bad["bytes"], bad_bytes.len());
    let id = bad["id"].as_str().unwrap();
    assert_eq!(
        get(&state, &format!("/v1/files/{id}/content"), Some(KEY))
            .await
            .bytes,
        bad_bytes
    );
    // Other purposes are stored as they come.
    assert_eq!(
        upload(&state, "assistants", b"not json").await["status"],
        "processed"
    );
}

#[tokio::test]
async fn bad_purpose_and_missing_fields_are_422() {
    let state = bare_state();
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let reply = upload_as(&state, KEY, "/v1/files", "poetry", "a.txt", b"x").await;
    let item = shape_c(&reply);
    assert_eq!(item["loc"], json!(["body", "purpose"]));
    assert_eq!(item["type"], "enum");
    assert_eq!(item["input"], "poetry");

    let body = form(&[("purpose", None, b"batch")]);
    let item = shape_c(&request(&state, "POST", "/v1/files", Some(KEY), Some(&ct), body).await);
    assert_eq!(item["loc"], json!(["body", "file"]));
    assert_eq!(item["type"], "missing");

    let body = form(&[("file", Some("a.txt"), b"x")]);
    let item = shape_c(&request(&state, "POST", "/v1/files", Some(KEY), Some(&ct), body).await);
    assert_eq!(item["loc"], json!(["body", "purpose"]));

    // A form's file input with nothing chosen: an empty part without a
    // file name (as browsers send it, and without the attribute) is no file.
    for name in [Some(""), None] {
        let body = form(&[("purpose", None, b"user_data"), ("file", name, b"")]);
        let item = shape_c(&request(&state, "POST", "/v1/files", Some(KEY), Some(&ct), body).await);
        assert_eq!(item["loc"], json!(["body", "file"]), "{name:?}");
        assert_eq!(item["type"], "missing");
    }

    let reply = request(
        &state,
        "POST",
        "/v1/files",
        Some(KEY),
        Some("application/json"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(shape_c(&reply)["loc"], json!(["body", "file"]));
    // Nothing was kept from the refused uploads.
    assert!(state.store.blobs().file_ids().await.unwrap().is_empty());
    assert_eq!(
        get(&state, "/v1/files", Some(KEY)).await.json()["data"],
        json!([])
    );
}

#[tokio::test]
async fn uploads_over_the_limit_are_413_and_leave_nothing() {
    let mut state = bare_state();
    state.max_upload_bytes = 200 * 1024;
    let big = vec![b'a'; 300 * 1024];
    let detail = shape_a(
        &upload_as(&state, KEY, "/v1/files", "user_data", "big.bin", &big).await,
        413,
    );
    assert!(detail.contains("limit"), "{detail}");
    // Just over the limit (the declared length alone would pass).
    let over = vec![b'a'; 200 * 1024 + 1];
    shape_a(
        &upload_as(&state, KEY, "/v1/files", "user_data", "big.bin", &over).await,
        413,
    );
    let at = vec![b'a'; 200 * 1024];
    assert_eq!(upload(&state, "user_data", &at).await["bytes"], 200 * 1024);
    assert_eq!(state.store.blobs().file_ids().await.unwrap().len(), 1);
    assert_eq!(
        get(&state, "/v1/files", Some(KEY)).await.json()["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn unknown_and_foreign_ids_are_403_alike() {
    let state = bare_state();
    let (other, other_key) = other_project(&state).await;
    let reply = upload_as(
        &state,
        &other_key,
        "/v1/files",
        "user_data",
        "theirs.txt",
        b"secret",
    )
    .await;
    assert_eq!(reply.status, 200);
    let theirs = reply.json()["id"].as_str().unwrap().to_string();
    let mine = upload(&state, "user_data", b"mine").await["id"]
        .as_str()
        .unwrap()
        .to_string();

    for id in [
        theirs.as_str(),
        "file-01J00000000000000000000000",
        "nonsense",
    ] {
        for suffix in ["", "/content", "/link"] {
            let detail = shape_a(
                &get(&state, &format!("/v1/files/{id}{suffix}"), Some(KEY)).await,
                403,
            );
            assert!(
                !detail.contains("Other") && !detail.contains(&other),
                "{detail}"
            );
        }
        let reply = request(
            &state,
            "DELETE",
            &format!("/v1/files/{id}"),
            Some(KEY),
            None,
            vec![],
        )
        .await;
        shape_a(&reply, 403);
    }
    // Their file is still there for them, mine is invisible to them.
    assert_eq!(
        get(
            &state,
            &format!("/v1/files/{theirs}/content"),
            Some(&other_key)
        )
        .await
        .bytes,
        b"secret"
    );
    shape_a(
        &get(&state, &format!("/v1/files/{mine}"), Some(&other_key)).await,
        403,
    );
    let list = get(&state, "/v1/files", Some(KEY)).await.json();
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0]["id"], mine.as_str());

    // Selecting a project: not reachable is 403, malformed is 400.
    shape_a(
        &get(
            &state,
            &format!("/v1/files?ai_project_id={other}"),
            Some(KEY),
        )
        .await,
        403,
    );
    shape_a(
        &get(&state, "/v1/files?ai_project_id=p1", Some(KEY)).await,
        400,
    );
    let reply = get(
        &state,
        &format!("/v1/files?ai_project_id={other}"),
        Some(&other_key),
    )
    .await;
    assert_eq!(reply.json()["data"][0]["id"], theirs.as_str());
    let reply = get(
        &state,
        &format!("/v1/files?ai_project_id={}", state.default_project),
        Some(&other_key),
    )
    .await;
    shape_a(&reply, 403);
}

#[tokio::test]
async fn lists_page_filter_and_order() {
    let state = bare_state();
    let mut ids = Vec::new();
    for (i, purpose) in ["batch", "user_data", "batch"].iter().enumerate() {
        let file = upload(&state, purpose, format!("{{\"n\": {i}}}\n").as_bytes()).await;
        ids.push(file["id"].as_str().unwrap().to_string());
    }
    let page = get(&state, "/v1/files?limit=2", Some(KEY)).await.json();
    let got: Vec<_> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[2].as_str(), ids[1].as_str()]);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["first_id"], ids[2].as_str());
    assert_eq!(page["last_id"], ids[1].as_str());
    let next = get(
        &state,
        &format!("/v1/files?limit=2&after={}", ids[1]),
        Some(KEY),
    )
    .await
    .json();
    assert_eq!(next["data"][0]["id"], ids[0].as_str());
    assert_eq!(next["has_more"], false);
    let asc = get(&state, "/v1/files?order=asc&purpose=batch", Some(KEY))
        .await
        .json();
    let got: Vec<_> = asc["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[0].as_str(), ids[2].as_str()]);
    let empty = get(&state, "/v1/files?purpose=fine-tune", Some(KEY))
        .await
        .json();
    assert_eq!(
        empty,
        json!({"object": "list", "data": [], "has_more": false, "first_id": null, "last_id": null})
    );

    // Out of range is 422 naming `limit`, as on every other list.
    for query in ["limit=0", "limit=10001", "limit=-3"] {
        assert_eq!(
            shape_c(&get(&state, &format!("/v1/files?{query}"), Some(KEY)).await)["loc"],
            json!(["query", "limit"])
        );
    }
    assert_eq!(
        shape_c(&get(&state, "/v1/files?purpose=poetry", Some(KEY)).await)["loc"],
        json!(["query", "purpose"])
    );
    assert_eq!(
        shape_c(&get(&state, "/v1/files?order=sideways", Some(KEY)).await)["loc"][1],
        "order"
    );
    assert_eq!(
        shape_c(&get(&state, "/v1/files?limit=many", Some(KEY)).await)["loc"][1],
        "limit"
    );
    shape_a(&get(&state, "/v1/files", None).await, 401);
    // Two Authorization headers are refused whichever comes first: which
    // one counts would be up to whoever added the second.
    for keys in [[KEY, "junk"], ["junk", KEY], [KEY, KEY]] {
        let request = axum::http::Request::get("/v1/files")
            .header("authorization", format!("Bearer {}", keys[0]))
            .header("authorization", format!("Bearer {}", keys[1]))
            .body(axum::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(hearth_server::app(state.clone()), request)
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{keys:?}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("more than one Authorization"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn signed_links_download_without_a_key_until_they_expire() {
    let state = bare_state();
    let id = upload(&state, "user_data", b"linked bytes").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let link = get(&state, &format!("/v1/files/{id}/link"), Some(KEY))
        .await
        .json();
    assert_eq!(link["object"], "file.link");
    assert_eq!(link["id"], id.as_str());
    let url = link["url"].as_str().unwrap();
    let path = url.strip_prefix("http://files.test").expect(url);
    let expires_at = link["expires_at"].as_i64().unwrap();
    assert!(expires_at > hearth_store::ids::now() + 3500);
    let reply = get(&state, path, None).await;
    assert_eq!(
        (reply.status, reply.bytes.as_slice()),
        (200, &b"linked bytes"[..])
    );

    // Tampered: another expiry, another signature, another file.
    shape_a(
        &get(
            &state,
            &path.replace(
                &format!("expires_at={expires_at}"),
                &format!("expires_at={}", expires_at + 1),
            ),
            None,
        )
        .await,
        403,
    );
    let (rest, last) = path.split_at(path.len() - 1);
    let flipped = format!("{rest}{}", if last == "0" { "1" } else { "0" });
    shape_a(&get(&state, &flipped, None).await, 403);
    shape_a(
        &get(&state, &format!("/v1/files/{id}/download"), None).await,
        403,
    );
    let other = upload(&state, "user_data", b"other").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    shape_a(&get(&state, &path.replace(&id, &other), None).await, 403);
    // Expired, though correctly signed.
    let past = hearth_store::ids::now() - 5;
    let sig = state.store.sign_link(&id, past);
    shape_a(
        &get(
            &state,
            &format!("/v1/files/{id}/download?expires_at={past}&signature={sig}"),
            None,
        )
        .await,
        403,
    );
    // A short link, and a bad duration.
    let short = get(
        &state,
        &format!("/v1/files/{id}/link?expires_in=5"),
        Some(KEY),
    )
    .await
    .json();
    assert!(short["expires_at"].as_i64().unwrap() <= hearth_store::ids::now() + 5);
    assert_eq!(
        get(
            &state,
            &format!("/v1/files/{id}/link?expires_in=0"),
            Some(KEY)
        )
        .await
        .status,
        400
    );
}

#[tokio::test]
async fn a_file_in_use_is_409_shape_a() {
    let error = hearth_server::error::HttpError::from(hearth_store::StoreError::InUse(
        "the file `file-x` is in use by ftjob-1".into(),
    ));
    let response = error.into_response();
    assert_eq!(response.status(), 409);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        body,
        json!({"detail": "the file `file-x` is in use by ftjob-1"})
    );
}
