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

/// A temporary folder of objects holding `rows.jsonl` (`rows`): the folder,
/// its path, and its `file://` URL prefix to allow.
fn objects(rows: &str) -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let allowed = format!("file://{}/", root.display());
    std::fs::write(root.join("rows.jsonl"), rows).unwrap();
    (dir, root, allowed)
}

/// Imports from object storage (`file://` here; `s3://` goes through the
/// same object_store path): only under an allowed prefix, answered with a
/// `PENDING` upload record that ends `COMPLETED` with the dataset, or
/// `FAILED` with what went wrong.
#[tokio::test]
async fn imports_read_allowed_objects_in_the_background() {
    let (_dir, root, allowed) = objects("{\"q\": \"a\", \"n\": 1}\n{\"q\": \"b\", \"n\": 2}\n");
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
    let _worker = hearth_server::dataset_imports::spawn(state.clone());
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
        format!("{allowed}./rows.jsonl"),
        format!("{allowed}rows.jsonl%00.csv"),
        format!("{allowed}rows.jsonl?x=1"),
        format!("{allowed}rows.jsonl#x"),
        format!("{allowed}..%2F..%2Fetc%2Fpasswd"),
        format!("{allowed}sub\\..\\..\\x.jsonl"),
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

/// A symbolic link under the allowed prefix is followed only where it
/// stays under it, and never into the server's own files, even when a
/// prefix covers them: the import fails without saying where the link led.
#[cfg(unix)]
#[tokio::test]
async fn links_out_of_the_prefix_or_into_the_servers_files_fail_the_import() {
    use std::os::unix::fs::symlink;
    let (_dir, root, allowed) = objects("{\"q\": \"a\"}\n");
    let server_files = tempfile::tempdir().unwrap();
    let data = server_files.path().canonicalize().unwrap();
    std::fs::write(data.join("hearth.db"), "q\nsecret\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let outside = outside.path().canonicalize().unwrap();
    std::fs::write(outside.join("other.csv"), "q\nsecret\n").unwrap();
    symlink(&data, root.join("datalink")).unwrap();
    symlink(outside.join("other.csv"), root.join("other.csv")).unwrap();
    symlink(root.join("rows.jsonl"), root.join("alias.jsonl")).unwrap();
    let mut state = bare_state();
    state.datasets.import_allow =
        vec![allowed.clone(), format!("file://{}/", data.display())].into();
    state.datasets.private_paths = vec![data.clone()].into();
    let _worker = hearth_server::dataset_imports::spawn(state.clone());
    let import = |url: String, format: &str| json!({"name": "x", "source": {"type": "object_storage", "url": url, "format": format}});
    for (url, format) in [
        (format!("{allowed}datalink/hearth.db"), "csv"),
        (format!("{allowed}other.csv"), "csv"),
        (format!("file://{}/hearth.db", data.display()), "csv"),
    ] {
        let started = ok(&call(
            &state,
            "POST",
            "/v1/datasets",
            KEY,
            Some(import(url.clone(), format)),
        )
        .await);
        let failed = settled(&state, started["id"].as_str().unwrap()).await;
        assert_eq!(failed["upload_info"]["status"], "FAILED", "{url}: {failed}");
        let error = failed["upload_info"]["error"].as_str().unwrap();
        assert!(error.contains("cannot be imported"), "{url}: {error}");
        assert!(!error.contains(&outside.display().to_string()), "{error}");
    }
    // A link that stays under the prefix is read.
    let started = ok(&call(
        &state,
        "POST",
        "/v1/datasets",
        KEY,
        Some(import(format!("{allowed}alias.jsonl"), "jsonl")),
    )
    .await);
    let done = settled(&state, started["id"].as_str().unwrap()).await;
    assert_eq!(done["upload_info"]["status"], "COMPLETED", "{done}");
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

/// Several nodes: an import held by a node that died (its claim's heartbeat
/// stale) is read again by another node's worker, and a part the dead node
/// had stored is left out (its blob deleted), so the dataset has each row
/// once. An import whose URL a node may not read is left, unclaimed, for a
/// node that may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_import_is_taken_over_and_read_once() {
    use hearth_server::nodes::NodeIdentity;
    use hearth_store::datasets::{new_part_id, part_blob_key, ImportClaimRules};

    let (_dir, _, allowed) = objects("{\"q\": \"a\"}\n{\"q\": \"b\"}\n{\"q\": \"c\"}\n");
    let mut state = bare_state();
    state.datasets.import_allow = vec![allowed.clone()].into();
    state.node = NodeIdentity {
        id: "node-b".into(),
        timeout_secs: 2,
    };
    let body = json!({"name": "taken-over", "schema": [{"name": "q", "type": {"name": "string"}}],
        "source": {"type": "object_storage", "url": format!("{allowed}rows.jsonl")}});
    // Queued with no worker running; node-a claims it and stores a part,
    // then dies.
    let started = ok(&call(&state, "POST", "/v1/datasets", KEY, Some(body.clone())).await);
    let id = started["id"].as_str().unwrap().to_string();
    let rules = ImportClaimRules {
        node: "node-a",
        stale_after_secs: 2,
        skip: &[],
        max_attempts: 3,
    };
    let (claim, _) = state.store.claim_import(&rules).await.unwrap();
    assert_eq!(claim.expect("node-a's claim").attempt, 1);
    let dead_part = new_part_id();
    let dead_key = part_blob_key(&id, &dead_part);
    state.store.blobs().put(&dead_key, b"half").await.unwrap();
    state
        .store
        .add_upload_part(&id, &dead_part, &dead_key, 3, 4, i64::MAX)
        .await
        .unwrap();

    let worker = hearth_server::dataset_imports::spawn(state.clone());
    // node-a's claim is fresh for two seconds: not taken yet.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let record = ok(&call(
        &state,
        "GET",
        &format!("/v1/datasets/uploads/{id}"),
        KEY,
        None,
    )
    .await);
    assert_eq!(record["upload_info"]["status"], "PENDING", "{record}");
    let done = settled(&state, &id).await;
    assert_eq!(done["upload_info"]["status"], "COMPLETED", "{done}");
    let dataset = done["upload_info"]["dataset"]["id"].as_str().unwrap();
    let content = ok(&call(
        &state,
        "GET",
        &format!("/v1/datasets/{dataset}/content"),
        KEY,
        None,
    )
    .await);
    assert_eq!(content["data"], json!([{"q": "a"}, {"q": "b"}, {"q": "c"}]));
    assert!(
        state.store.blobs().get(&dead_key).await.is_err(),
        "the dead node's part is deleted"
    );
    // node-a, back from the dead, holds nothing any more.
    assert!(!state.store.renew_import(&id, "node-a").await.unwrap());
    worker.stop().await;

    // A node that may not read the URL leaves the import for one that may.
    let queued = ok(&call(&state, "POST", "/v1/datasets", KEY, Some(body)).await);
    let queued = queued["id"].as_str().unwrap().to_string();
    let mut elsewhere = state.clone();
    elsewhere.node = NodeIdentity {
        id: "node-c".into(),
        timeout_secs: 2,
    };
    elsewhere.datasets.import_allow = vec!["file:///srv/other/".to_string()].into();
    let refusing = hearth_server::dataset_imports::spawn(elsewhere);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let record = ok(&call(
        &state,
        "GET",
        &format!("/v1/datasets/uploads/{queued}"),
        KEY,
        None,
    )
    .await);
    assert_eq!(record["upload_info"]["status"], "PENDING", "{record}");
    refusing.stop().await;
    // Released as if never claimed: the next node's claim is its first.
    let rules = ImportClaimRules {
        node: "node-d",
        ..rules
    };
    let (claim, _) = state.store.claim_import(&rules).await.unwrap();
    let claim = claim.expect("claimable");
    assert_eq!(
        (claim.upload.id.as_str(), claim.attempt),
        (queued.as_str(), 1)
    );
}
