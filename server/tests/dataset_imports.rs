//! Dataset imports from object storage through the in-process router.

mod common;
mod datasets_common;

use common::raw::*;
use common::*;
use datasets_common::*;
use hearth_server::AppState;
use serde_json::{json, Value};

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

/// `GET /v1/datasets/uploads/{id}`: the caller's upload in any of its
/// projects; another project's key, or an id that names nothing, is 403.
#[tokio::test]
async fn an_upload_is_read_only_by_its_projects() {
    let state = bare_state();
    let upload = create_upload(
        &state,
        KEY,
        "/v1/datasets/uploads",
        json!({"name": "mine", "schema": full_schema()}),
    )
    .await;
    let id = id_of(&upload);
    let uri = format!("/v1/datasets/uploads/{id}");
    let read = ok(&call(&state, "GET", &uri, KEY, None).await);
    assert_eq!(read, upload);
    let (_, other_key) = other_project(&state).await;
    shape_a(&call(&state, "GET", &uri, &other_key, None).await, 403);
    let missing = "/v1/datasets/uploads/dsupload-01J00000000000000000000000";
    shape_a(&call(&state, "GET", missing, KEY, None).await, 403);
}
