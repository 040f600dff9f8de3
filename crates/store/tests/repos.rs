//! Repository tests. Each test function runs twice: on SQLite (always) and
//! on PostgreSQL when `HEARTH_TEST_DATABASE_URL` names a server (a fresh
//! database per test is created on it; `scripts/test` starts one).

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use futures_util::TryStreamExt;
use std::time::Duration;

use hearth_store::{ListOrder, Store, StoreError};
use sha2::{Digest, Sha256};

on_both!(
    projects_and_the_default_project,
    accounts_reach_their_projects,
    keys_are_hashed_listed_and_revoked,
    bootstrap_makes_one_admin_key,
    nodes_starting_together_make_one_admin_key,
    files_round_trip_and_are_scoped,
    files_list_pages_filters_and_orders,
    jsonl_uploads_are_checked,
    uploads_over_the_limit_leave_nothing,
    orphan_blobs_are_swept,
    settings_and_links,
    responses_are_kept_per_project,
    console_sessions_follow_their_key,
    names_and_quota_models_are_checked,
);

async fn projects_and_the_default_project(env: Env) {
    let s = &env.store;
    let default = s.default_project().await.unwrap();
    assert!(
        hearth_store::projects::is_well_formed(&default.id),
        "{}",
        default.id
    );
    assert_eq!(default.name, "Default");
    assert_eq!(s.default_project().await.unwrap(), default);
    let other = s.create_project("Research").await.unwrap();
    let all = s.projects().await.unwrap();
    assert_eq!(all, vec![default.clone(), other.clone()]);
    assert_eq!(s.project(&other.id).await.unwrap(), Some(other));
    assert_eq!(s.project("project-nope").await.unwrap(), None);
}

async fn accounts_reach_their_projects(env: Env) {
    let s = &env.store;
    let a = s.create_project("A").await.unwrap();
    let b = s.create_project("B").await.unwrap();
    let account = s.create_account("alice", &a.id, false).await.unwrap();
    assert!(s.can_reach(&account.id, &a.id).await.unwrap());
    assert!(!s.can_reach(&account.id, &b.id).await.unwrap());
    s.grant_project(&account.id, &b.id).await.unwrap();
    s.grant_project(&account.id, &b.id).await.unwrap();
    assert!(s.can_reach(&account.id, &b.id).await.unwrap());
    let mut expected = vec![a.id.clone(), b.id.clone()];
    expected.sort();
    assert_eq!(s.account_projects(&account.id).await.unwrap(), expected);
    assert_eq!(s.account(&account.id).await.unwrap(), Some(account));
    assert!(matches!(
        s.create_account("bob", "project-missing", false).await,
        Err(StoreError::Invalid(_))
    ));
}

async fn keys_are_hashed_listed_and_revoked(env: Env) {
    let s = &env.store;
    let project = s.create_project("P").await.unwrap();
    let new = s.create_key("ci", Some(&project.id), false).await.unwrap();
    assert!(new.secret.starts_with("hearth-") && new.secret.len() == 7 + 64);
    assert!(new.secret.starts_with(&new.info.prefix));
    assert_eq!(new.info.default_project_id, project.id);
    assert_eq!(new.info.last_used_at, None);
    let caller = s
        .authenticate(&new.secret)
        .await
        .unwrap()
        .expect("a live key");
    assert_eq!(caller.key_id.as_deref(), Some(new.info.id.as_str()));
    assert!(!caller.is_admin);
    assert!(s.caller_reaches(&caller, &project.id).await.unwrap());
    let default = s.default_project().await.unwrap();
    assert!(!s.caller_reaches(&caller, &default.id).await.unwrap());
    assert_eq!(s.authenticate("hearth-0000").await.unwrap(), None);
    assert_eq!(s.authenticate("other").await.unwrap(), None);

    s.touch_key(&new.info.id).await.unwrap();
    let listed = s.keys().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].last_used_at.is_some());
    let revoked = s.revoke_key(&new.info.id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    assert_eq!(s.authenticate(&new.secret).await.unwrap(), None);
    assert!(matches!(
        s.revoke_key("key-nope").await,
        Err(StoreError::NotFound(_))
    ));
}

async fn bootstrap_makes_one_admin_key(env: Env) {
    let s = &env.store;
    let admin = s
        .bootstrap_admin()
        .await
        .unwrap()
        .expect("an admin key on an empty store");
    assert!(admin.info.is_admin);
    assert_eq!(
        admin.info.default_project_id,
        s.default_project().await.unwrap().id
    );
    assert!(s.bootstrap_admin().await.unwrap().is_none());
    s.revoke_key(&admin.info.id).await.unwrap();
    assert!(s.bootstrap_admin().await.unwrap().is_some());
}

async fn nodes_starting_together_make_one_admin_key(env: Env) {
    // Two at once on a fresh store (this backend's): one key between them,
    // and the setting given back (a later start without an admin key makes
    // one again).
    let s = &env.store;
    let (a, b) = tokio::join!(s.bootstrap_admin(), s.bootstrap_admin());
    let made = [a.unwrap(), b.unwrap()];
    assert_eq!(made.iter().filter(|k| k.is_some()).count(), 1);
    assert_eq!(s.setting("admin_bootstrap").await.unwrap(), None);
    // Another node is making the key right now: none here.
    let fresh = sqlite().await;
    let now = hearth_store::ids::now();
    let s = &fresh.store;
    s.setting_or_insert("admin_bootstrap", &format!("other:{now}"))
        .await
        .unwrap();
    assert!(s.bootstrap_admin().await.unwrap().is_none());
    // That node died before making it: a minute later it is taken over.
    let fresh = sqlite().await;
    let s = &fresh.store;
    s.setting_or_insert("admin_bootstrap", "dead:1")
        .await
        .unwrap();
    assert!(s.bootstrap_admin().await.unwrap().is_some());
}

async fn upload(
    s: &Store,
    project: &str,
    purpose: &str,
    content: &[u8],
) -> hearth_store::FileRecord {
    let mut up = s.begin_upload(1 << 30).await.unwrap();
    for chunk in content.chunks(7) {
        up.write(chunk).await.unwrap();
    }
    let jsonl = purpose == "fine-tune" || purpose == "batch";
    s.finish_upload(up, project, "data.jsonl", purpose, jsonl)
        .await
        .unwrap()
}

async fn content(s: &Store, f: &hearth_store::FileRecord) -> Vec<u8> {
    let chunks: Vec<_> = s
        .file_content(f)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    chunks.concat()
}

async fn files_round_trip_and_are_scoped(env: Env) {
    let s = &env.store;
    let a = s.create_project("A").await.unwrap();
    let b = s.create_project("B").await.unwrap();
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let f = upload(s, &a.id, "user_data", &bytes).await;
    assert!(hearth_store::files::is_well_formed(&f.id));
    assert_eq!(f.bytes, bytes.len() as i64);
    assert_eq!(f.status, "processed");
    assert_eq!(s.file(&a.id, &f.id).await.unwrap(), f);
    assert_eq!(Sha256::digest(content(s, &f).await), Sha256::digest(&bytes));
    assert!(matches!(
        s.file(&b.id, &f.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.delete_file(&b.id, &f.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.file_users(&f.id).await.unwrap().is_empty());
    s.delete_file(&a.id, &f.id).await.unwrap();
    assert!(matches!(
        s.file(&a.id, &f.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(!s.blobs().exists(&f.id).await.unwrap());
    assert!(matches!(
        s.delete_file(&a.id, &f.id).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn files_list_pages_filters_and_orders(env: Env) {
    let s = &env.store;
    let p = s.create_project("P").await.unwrap();
    let other = s.create_project("Q").await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let purpose = if i % 2 == 0 { "batch" } else { "user_data" };
        ids.push(upload(s, &p.id, purpose, b"{\"x\": 1}\n").await.id);
    }
    upload(s, &other.id, "batch", b"{}\n").await;
    let (page, more) = s
        .list_files(&p.id, None, None, 2, ListOrder::Desc)
        .await
        .unwrap();
    assert!(more);
    assert_eq!(
        page.iter().map(|f| &f.id).collect::<Vec<_>>(),
        vec![&ids[4], &ids[3]]
    );
    let (page, more) = s
        .list_files(&p.id, None, Some(&ids[3]), 10, ListOrder::Desc)
        .await
        .unwrap();
    assert!(!more);
    assert_eq!(page.len(), 3);
    let (page, _) = s
        .list_files(&p.id, None, None, 10, ListOrder::Asc)
        .await
        .unwrap();
    assert_eq!(page.iter().map(|f| f.id.clone()).collect::<Vec<_>>(), ids);
    let (page, more) = s
        .list_files(&p.id, Some("batch"), Some(&ids[0]), 10, ListOrder::Asc)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|f| &f.id).collect::<Vec<_>>(),
        vec![&ids[2], &ids[4]]
    );
    assert!(!more);
}

async fn jsonl_uploads_are_checked(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap();
    let good = upload(
        s,
        &p.id,
        "fine-tune",
        b"{\"messages\": []}\n{\"messages\": []}\n",
    )
    .await;
    assert_eq!(
        (good.status.as_str(), good.status_details.as_deref()),
        ("processed", None)
    );
    let bad = upload(s, &p.id, "batch", b"{\"a\": 1}\n{\"b\": 2}\nnot json\n").await;
    assert_eq!(bad.status, "error");
    assert!(
        bad.status_details.as_deref().unwrap().starts_with("line 3"),
        "{bad:?}"
    );
    assert_eq!(
        content(s, &bad).await,
        b"{\"a\": 1}\n{\"b\": 2}\nnot json\n"
    );
    let any = upload(s, &p.id, "user_data", b"not json").await;
    assert_eq!(any.status, "processed");
}

async fn uploads_over_the_limit_leave_nothing(env: Env) {
    let s = &env.store;
    let mut up = s.begin_upload(10).await.unwrap();
    up.write(b"0123456789").await.unwrap();
    assert!(matches!(
        up.write(b"x").await,
        Err(StoreError::TooLarge { limit: 10 })
    ));
    up.abort().await;
    assert!(s.blobs().file_ids().await.unwrap().is_empty());
}

async fn orphan_blobs_are_swept(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap();
    let kept = upload(s, &p.id, "user_data", b"kept").await;
    // A blob completed by an upload whose row never committed.
    let mut w = s.blobs().writer("file-orphan").await.unwrap();
    w.write(b"lost").await.unwrap();
    w.finish().await.unwrap();
    // Too young: it may be another node's upload whose row is about to
    // commit.
    assert_eq!(
        s.sweep_orphan_blobs(hearth_store::ORPHAN_GRACE)
            .await
            .unwrap(),
        0
    );
    assert_eq!(s.blobs().file_ids().await.unwrap().len(), 2);
    assert_eq!(s.sweep_orphan_blobs(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(s.blobs().file_ids().await.unwrap(), vec![kept.id.clone()]);
    assert_eq!(content(s, &kept).await, b"kept");
}

async fn settings_and_links(env: Env) {
    let s = &env.store;
    assert_eq!(s.setting("x").await.unwrap(), None);
    assert_eq!(s.setting_or_insert("x", "1").await.unwrap(), "1");
    assert_eq!(s.setting_or_insert("x", "2").await.unwrap(), "1");
    let later = hearth_store::ids::now() + 60;
    let sig = s.sign_link("file-a", later);
    assert!(s.verify_link("file-a", later, &sig));
    assert!(!s.verify_link("file-b", later, &sig));
    assert!(!s.verify_link("file-a", later + 1, &sig));
    assert!(!s.verify_link("file-a", later, "00"));
    let past = hearth_store::ids::now() - 1;
    assert!(!s.verify_link("file-a", past, &s.sign_link("file-a", past)));
}

async fn responses_are_kept_per_project(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let r = hearth_store::StoredResponse {
        id: "resp_0001".into(),
        project_id: p.clone(),
        created_at: 7,
        previous_response_id: None,
        body: serde_json::json!({"id": "resp_0001", "output": [{"text": "hé"}]}),
        input_items: serde_json::json!([{"role": "user"}]),
        conversation: serde_json::json!([{"role": "user", "content": "x"}]),
    };
    s.create_response(&r).await.unwrap();
    assert_eq!(s.response_by_id("resp_0001").await.unwrap(), r);
    // A second create of the id is refused; a replace in its project
    // takes its place; one from another project is refused and changes
    // nothing.
    assert!(s.create_response(&r).await.is_err());
    let rerun = hearth_store::StoredResponse {
        created_at: 9,
        body: serde_json::json!({"id": "resp_0001", "output": [{"text": "again"}]}),
        ..r.clone()
    };
    s.replace_response(&rerun).await.unwrap();
    assert_eq!(s.response_by_id("resp_0001").await.unwrap(), rerun);
    let foreign = hearth_store::StoredResponse {
        project_id: other.clone(),
        ..r.clone()
    };
    assert!(matches!(
        s.replace_response(&foreign).await,
        Err(StoreError::InUse(_))
    ));
    assert_eq!(s.response_by_id("resp_0001").await.unwrap(), rerun);
    s.replace_response(&hearth_store::StoredResponse {
        id: "resp_0002".into(),
        ..r.clone()
    })
    .await
    .unwrap();
    assert_eq!(s.response_by_id("resp_0002").await.unwrap().created_at, 7);
    assert!(matches!(
        s.response_by_id("resp_nope").await,
        Err(StoreError::NotFound(_))
    ));
    // Deleting from another project finds nothing; from its own, once.
    assert!(matches!(
        s.delete_response(&other, "resp_0001").await,
        Err(StoreError::NotFound(_))
    ));
    s.delete_response(&p, "resp_0001").await.unwrap();
    assert!(matches!(
        s.delete_response(&p, "resp_0001").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.response_by_id("resp_0001").await.is_err());
}

async fn console_sessions_follow_their_key(env: Env) {
    let s = &env.store;
    let project = s.create_project("P").await.unwrap();
    let other = s.create_project("Q").await.unwrap();
    let new = s.create_key("web", Some(&project.id), false).await.unwrap();
    let second = s.add_key(&new.info.account_id, "second").await.unwrap();
    let mine = s.account_keys(&new.info.account_id).await.unwrap();
    assert_eq!(
        mine.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
        vec![new.info.id.as_str(), second.info.id.as_str()]
    );
    let token = s.create_console_session(&new.info.id, 3600).await.unwrap();
    assert_eq!(token.len(), 64);
    let session = s.console_session(&token).await.unwrap().expect("live");
    assert_eq!(session.caller.key_id.as_deref(), Some(new.info.id.as_str()));
    assert_eq!(session.project_id, project.id);
    assert_eq!(session.key_name, "web");
    assert_eq!(session.csrf_token.len(), 64);
    assert_ne!(session.csrf_token, token);
    assert_eq!(s.console_session("nope").await.unwrap(), None);
    s.set_console_project(&token, &other.id).await.unwrap();
    assert_eq!(
        s.console_session(&token).await.unwrap().unwrap().project_id,
        other.id
    );
    // Expired at once: never found.
    let expired = s.create_console_session(&new.info.id, 0).await.unwrap();
    assert_eq!(s.console_session(&expired).await.unwrap(), None);
    // Sign-out deletes; a revoked key ends its sessions.
    let other_token = s.create_console_session(&new.info.id, 3600).await.unwrap();
    s.delete_console_session(&token).await.unwrap();
    assert_eq!(s.console_session(&token).await.unwrap(), None);
    assert!(s.console_session(&other_token).await.unwrap().is_some());
    s.revoke_key(&new.info.id).await.unwrap();
    assert_eq!(s.console_session(&other_token).await.unwrap(), None);
    assert!(matches!(
        s.create_console_session(&new.info.id, 3600).await,
        Err(StoreError::NotFound(_))
    ));
}

/// Projects, keys and quota models need a name that is not blank and at
/// most 256 characters (what the CLI and the HTTP routes both go through);
/// nothing is made for a refused one.
async fn names_and_quota_models_are_checked(env: Env) {
    let s = &env.store;
    let long = "n".repeat(257);
    let invalid = |r: &Result<(), StoreError>, field: &str| {
        assert!(
            matches!(r, Err(StoreError::Invalid(m)) if m.contains(&format!("`{field}`"))),
            "{r:?}"
        );
    };
    let before = s.projects().await.unwrap().len();
    for bad in ["", "  \t", long.as_str()] {
        invalid(&s.create_project(bad).await.map(drop), "name");
        invalid(&s.create_key(bad, None, false).await.map(drop), "name");
    }
    assert_eq!(s.projects().await.unwrap().len(), before);
    assert!(s.keys().await.unwrap().is_empty());
    let project = s.create_project(&"p".repeat(256)).await.unwrap().id;
    let key = s.create_key(&"k".repeat(256), None, false).await.unwrap();
    invalid(
        &s.add_key(&key.info.account_id, " ").await.map(drop),
        "name",
    );
    for bad in ["", " ", long.as_str()] {
        invalid(
            &s.set_quota(&project, bad, Some(100), None, None)
                .await
                .map(drop),
            "model",
        );
    }
    // `*` and a model not served (yet) are fine; clearing takes any name.
    for model in ["*", "ft:some-model-not-served"] {
        assert!(s
            .set_quota(&project, model, Some(100), None, None)
            .await
            .unwrap()
            .is_some());
    }
    assert_eq!(
        s.set_quota(&project, "", None, None, None).await.unwrap(),
        None
    );
    assert_eq!(s.quotas().await.unwrap().len(), 2);
}
