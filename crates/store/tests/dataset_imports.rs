//! Claims on dataset imports between nodes: one node at a time, taken over
//! when the holder's heartbeat goes stale, writes by a node that lost its
//! claim refused, and an import past its attempts failed. On SQLite, and on
//! PostgreSQL when `HEARTH_TEST_DATABASE_URL` names a server.

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::datasets::schema::{Column, ColumnType};
use hearth_store::datasets::{ImportClaimRules, NewUpload, UploadStatus};
use hearth_store::Store;

on_both!(
    one_node_holds_an_import_until_it_goes_stale,
    an_import_past_its_attempts_fails,
);

async fn import(s: &Store, name: &str) -> String {
    let project = s.default_project().await.unwrap().id;
    s.create_upload(NewUpload {
        project_id: project,
        name: name.to_string(),
        folder: None,
        description: None,
        schema: vec![Column::new("q", ColumnType::String)],
        source: Some(serde_json::json!({"type": "object_storage",
            "url": "s3://bucket/rows.jsonl", "format": "jsonl"})),
    })
    .await
    .unwrap()
    .id
}

fn rules(node: &str, stale_after_secs: i64) -> ImportClaimRules<'_> {
    ImportClaimRules {
        node,
        stale_after_secs,
        skip: &[],
        max_attempts: 3,
    }
}

async fn one_node_holds_an_import_until_it_goes_stale(env: Env) {
    let s = &env.store;
    // A plain upload (no source) is never claimed.
    let project = s.default_project().await.unwrap().id;
    s.create_upload(NewUpload {
        project_id: project,
        name: "parts".into(),
        folder: None,
        description: None,
        schema: vec![Column::new("q", ColumnType::String)],
        source: None,
    })
    .await
    .unwrap();
    let id = import(s, "imp").await;

    let (a, _) = s.claim_import(&rules("node-a", 60)).await.unwrap();
    let a = a.expect("node-a claims it");
    assert_eq!((a.upload.id.as_str(), a.attempt), (id.as_str(), 1));
    // Fresh: node-b gets nothing; node-a renews.
    assert!(s
        .claim_import(&rules("node-b", 60))
        .await
        .unwrap()
        .0
        .is_none());
    assert!(s.renew_import(&id, "node-a").await.unwrap());
    // Stale (a zero-second lease, a second later): node-b takes it over.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (b, _) = s.claim_import(&rules("node-b", 0)).await.unwrap();
    assert_eq!(b.expect("taken over").attempt, 2);
    // node-a lost it: no renewal, and its failure does not apply.
    assert!(!s.renew_import(&id, "node-a").await.unwrap());
    assert!(s
        .fail_import(&id, "node-a", "late")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        s.upload_by_id(&id).await.unwrap().status,
        UploadStatus::Pending
    );
    // node-b gives it back in good order: the attempt does not count.
    assert!(s.release_import(&id, "node-b").await.unwrap());
    let (c, _) = s.claim_import(&rules("node-c", 60)).await.unwrap();
    assert_eq!(c.expect("claimable again").attempt, 2);
    assert!(s.fail_import(&id, "node-c", "unreadable").await.is_ok());
    let failed = s.upload_by_id(&id).await.unwrap();
    assert_eq!(failed.status, UploadStatus::Failed);
    assert_eq!(failed.error.as_deref(), Some("unreadable"));
    assert!(s
        .claim_import(&rules("node-d", 0))
        .await
        .unwrap()
        .0
        .is_none());
}

async fn an_import_past_its_attempts_fails(env: Env) {
    let s = &env.store;
    let id = import(s, "crashes").await;
    for attempt in 1..=3 {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let (claim, _) = s.claim_import(&rules("node-a", 0)).await.unwrap();
        assert_eq!(claim.expect("claimed").attempt, attempt);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (claim, _) = s.claim_import(&rules("node-b", 0)).await.unwrap();
    assert!(claim.is_none(), "the fourth claim fails it instead");
    let failed = s.upload_by_id(&id).await.unwrap();
    assert_eq!(failed.status, UploadStatus::Failed);
    assert!(
        failed.error.as_deref().unwrap().contains("3 times"),
        "{:?}",
        failed.error
    );
}
