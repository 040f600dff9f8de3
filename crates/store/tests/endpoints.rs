//! Dedicated endpoint repository tests: create, read and list (per project
//! and for the reconciler), routing keys (unique, found, freed by a purge),
//! patches (which of them bump the generation and how the status follows),
//! the reconciler's status reports (only for the current generation), delete
//! (`deleting`, then purge), the counts per status and which node runs an
//! endpoint (claims). Each runs on SQLite,
//! and on PostgreSQL when `HEARTH_TEST_DATABASE_URL` names a server (a fresh
//! database per test).

#[macro_use]
mod common;

use std::time::Duration;

use common::{postgres, sqlite, Env};
use hearth_store::{DedicatedEndpoint, EndpointPatch, NewEndpoint, Store, StoreError};

on_both!(
    endpoints_are_created_read_and_listed,
    taken_routing_keys_and_ids_are_refused,
    name_and_description_keep_generation_and_status,
    changes_of_what_runs_bump_generation_and_status,
    status_reports_apply_only_to_the_current_generation,
    deleting_then_purging_frees_the_routing_key,
    routing_keys_find_endpoints_of_any_project,
    counts_by_status,
    concurrent_updates_each_bump_the_generation_once,
    a_patch_naming_what_runs_retries_a_failed_endpoint,
    one_node_runs_an_endpoint_until_its_claim_goes_stale,
);

/// A UUID v4 shaped id, distinct per `n`.
fn uuid(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn new_endpoint(project: &str, n: u64, routing_key: &str) -> NewEndpoint {
    NewEndpoint {
        id: uuid(n),
        project_id: project.to_string(),
        name: format!("endpoint {n}"),
        description: Some("for the nightly evals".to_string()),
        model_name: "smol-135m".to_string(),
        routing_key: routing_key.to_string(),
        flavor_name: "gpu-small".to_string(),
        gpu_type: Some("h100".to_string()),
        gpu_count: 1,
        region: "local".to_string(),
        min_replicas: 1,
        max_replicas: 2,
        enabled: true,
    }
}

fn ids(endpoints: &[DedicatedEndpoint]) -> Vec<&str> {
    endpoints.iter().map(|e| e.id.as_str()).collect()
}

/// An endpoint of `project` that the reconciler reported `running`.
async fn running_endpoint(s: &Store, project: &str, n: u64, key: &str) -> DedicatedEndpoint {
    let e = s
        .create_endpoint(new_endpoint(project, n, key))
        .await
        .unwrap();
    assert!(s
        .set_endpoint_status(&e.id, e.generation, "running", None)
        .await
        .unwrap());
    let e = s.endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(e.status, "running");
    e
}

fn flavor(name: &str) -> EndpointPatch {
    EndpointPatch {
        flavor_name: Some(name.to_string()),
        ..Default::default()
    }
}

async fn endpoints_are_created_read_and_listed(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;

    // Created later but with the smaller id: lists go by creation time.
    let first = s
        .create_endpoint(new_endpoint(&p, 9, "first"))
        .await
        .unwrap();
    assert_eq!(first.id, uuid(9));
    assert_eq!(first.project_id, p);
    assert_eq!(first.name, "endpoint 9");
    assert_eq!(first.description.as_deref(), Some("for the nightly evals"));
    assert_eq!(first.model_name, "smol-135m");
    assert_eq!(first.routing_key, "first");
    assert_eq!(first.flavor_name, "gpu-small");
    assert_eq!(first.gpu_type.as_deref(), Some("h100"));
    assert_eq!(first.gpu_count, 1);
    assert_eq!(first.region, "local");
    assert_eq!((first.min_replicas, first.max_replicas), (1, 2));
    assert!(first.enabled);
    assert_eq!(first.status, "provisioning");
    assert_eq!(first.status_reason, None);
    assert_eq!(first.generation, 1);
    assert_eq!(first.created_at, first.updated_at);
    assert!(first.created_at > 1_600_000_000, "{}", first.created_at);
    // What was stored reads back the same.
    assert_eq!(s.endpoint_by_id(&first.id).await.unwrap(), first);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut new = new_endpoint(&p, 1, "second");
    new.enabled = false;
    new.description = None;
    new.gpu_type = None;
    let second = s.create_endpoint(new).await.unwrap();
    assert!(!second.enabled);
    assert_eq!(second.status, "stopped");
    assert_eq!(
        (second.description.clone(), second.gpu_type.clone()),
        (None, None)
    );
    assert!(second.created_at > first.created_at);
    assert_eq!(s.endpoint_by_id(&second.id).await.unwrap(), second);

    let theirs = s
        .create_endpoint(new_endpoint(&other, 5, "theirs"))
        .await
        .unwrap();

    // Per project, oldest first; another project's endpoints are not shown.
    assert_eq!(
        s.list_endpoints(&p).await.unwrap(),
        [first.clone(), second.clone()]
    );
    assert_eq!(
        s.list_endpoints(&other).await.unwrap(),
        vec![theirs.clone()]
    );
    assert!(s
        .list_endpoints("project-missing")
        .await
        .unwrap()
        .is_empty());
    // The reconciler sees every project's.
    let all = s.all_endpoints().await.unwrap();
    assert_eq!(ids(&all), [&first.id, &second.id, &theirs.id]);
    // By id whatever the project.
    assert_eq!(s.endpoint_by_id(&theirs.id).await.unwrap(), theirs);

    assert!(matches!(
        s.endpoint_by_id(&uuid(404)).await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    // An endpoint of an unknown project is refused.
    assert!(s
        .create_endpoint(new_endpoint("project-missing", 6, "orphan"))
        .await
        .is_err());
    assert_eq!(s.endpoint_by_routing_key("orphan").await.unwrap(), None);
}

async fn taken_routing_keys_and_ids_are_refused(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let taken = s
        .create_endpoint(new_endpoint(&p, 1, "shared-key"))
        .await
        .unwrap();

    // In the same project or another: the key is the server's, not the
    // project's.
    for project in [&p, &other] {
        match s
            .create_endpoint(new_endpoint(project, 2, "shared-key"))
            .await
        {
            Err(StoreError::InUse(message)) => {
                assert!(message.contains("shared-key"), "{message}")
            }
            other => panic!("expected InUse, got {other:?}"),
        }
    }
    // Nothing of the refused rows was kept.
    assert!(matches!(
        s.endpoint_by_id(&uuid(2)).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.all_endpoints().await.unwrap(), vec![taken.clone()]);

    // The same id with a free key: refused too, naming the id.
    match s.create_endpoint(new_endpoint(&p, 1, "free-key")).await {
        Err(StoreError::InUse(message)) => assert!(message.contains(&uuid(1)), "{message}"),
        other => panic!("expected InUse, got {other:?}"),
    }
    assert_eq!(s.endpoint_by_routing_key("free-key").await.unwrap(), None);
    assert_eq!(s.endpoint_by_id(&taken.id).await.unwrap(), taken);
}

async fn name_and_description_keep_generation_and_status(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let e = running_endpoint(s, &p, 1, "key").await;
    assert!(s
        .set_endpoint_status(&e.id, 1, "running", Some("2 replicas"))
        .await
        .unwrap());

    let renamed = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                name: Some("renamed".to_string()),
                description: Some(Some("new words".to_string())),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(renamed.name, "renamed");
    assert_eq!(renamed.description.as_deref(), Some("new words"));
    assert_eq!(renamed.generation, 1);
    assert_eq!(renamed.status, "running");
    assert_eq!(renamed.status_reason.as_deref(), Some("2 replicas"));
    assert!(renamed.updated_at >= e.updated_at);
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), renamed);

    // `Some(None)` clears the description; `None` keeps the name.
    let cleared = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                description: Some(None),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cleared.description, None);
    assert_eq!(cleared.name, "renamed");
    assert_eq!(
        (cleared.generation, cleared.status.as_str()),
        (1, "running")
    );

    // Fields of what runs given with their current values change nothing.
    let same = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                flavor_name: Some("gpu-small".to_string()),
                min_replicas: Some(1),
                max_replicas: Some(2),
                enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((same.generation, same.status.as_str()), (1, "running"));
    assert_eq!(same.status_reason.as_deref(), Some("2 replicas"));
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), same);

    assert!(matches!(
        s.update_endpoint(&uuid(404), &EndpointPatch::default())
            .await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
}

async fn changes_of_what_runs_bump_generation_and_status(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;

    // Still provisioning: stays provisioning, at a new generation.
    let e = s.create_endpoint(new_endpoint(&p, 1, "key")).await.unwrap();
    let e = s
        .update_endpoint(&e.id, &flavor("gpu-large"))
        .await
        .unwrap();
    assert_eq!(e.flavor_name, "gpu-large");
    assert_eq!((e.generation, e.status.as_str()), (2, "provisioning"));
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);

    // Running: updating, the old reason cleared.
    assert!(s
        .set_endpoint_status(&e.id, 2, "running", Some("1 replica"))
        .await
        .unwrap());
    let e = s
        .update_endpoint(&e.id, &flavor("gpu-small"))
        .await
        .unwrap();
    assert_eq!((e.generation, e.status.as_str()), (3, "updating"));
    assert_eq!(e.flavor_name, "gpu-small");
    assert_eq!(e.status_reason, None);
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);

    // Scaling is a change of what runs too.
    assert!(s
        .set_endpoint_status(&e.id, 3, "running", None)
        .await
        .unwrap());
    let e = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                min_replicas: Some(2),
                max_replicas: Some(4),
                name: Some("bigger".to_string()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((e.min_replicas, e.max_replicas), (2, 4));
    assert_eq!(e.name, "bigger");
    assert_eq!((e.generation, e.status.as_str()), (4, "updating"));
    let e = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                max_replicas: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((e.max_replicas, e.generation), (3, 5));

    // Disabled: stopping.
    let e = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                enabled: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!e.enabled);
    assert_eq!((e.generation, e.status.as_str()), (6, "stopping"));
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);

    // Disabled and stopped, a new flavor keeps it stopped; enabled again,
    // nothing runs yet: provisioning.
    assert!(s
        .set_endpoint_status(&e.id, 6, "stopped", None)
        .await
        .unwrap());
    let e = s
        .update_endpoint(&e.id, &flavor("gpu-large"))
        .await
        .unwrap();
    assert_eq!((e.generation, e.status.as_str()), (7, "stopped"));
    let e = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(e.enabled);
    assert_eq!((e.generation, e.status.as_str()), (8, "provisioning"));
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);
}

async fn status_reports_apply_only_to_the_current_generation(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let e = running_endpoint(s, &p, 1, "key").await;
    let e = s
        .update_endpoint(&e.id, &flavor("gpu-large"))
        .await
        .unwrap();
    assert_eq!((e.generation, e.status.as_str()), (2, "updating"));

    // A report about generation 1 comes too late: nothing changes.
    assert!(!s
        .set_endpoint_status(&e.id, 1, "failed", Some("out of memory"))
        .await
        .unwrap());
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);
    // Nor for a generation not reached yet, nor a missing endpoint.
    assert!(!s
        .set_endpoint_status(&e.id, 3, "running", None)
        .await
        .unwrap());
    assert!(!s
        .set_endpoint_status(&uuid(404), 1, "running", None)
        .await
        .unwrap());
    // The reconciler cannot delete.
    for status in ["deleting", "deleted"] {
        assert!(matches!(
            s.set_endpoint_status(&e.id, 2, status, None).await,
            Err(StoreError::Invalid(_))
        ));
    }
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), e);

    // The current generation's report applies; `updated_at` moves with the
    // status only.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(s
        .set_endpoint_status(&e.id, 2, "failed", Some("out of memory"))
        .await
        .unwrap());
    let failed = s.endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(failed.status, "failed");
    assert_eq!(failed.status_reason.as_deref(), Some("out of memory"));
    assert_eq!(failed.generation, 2);
    assert!(failed.updated_at > e.updated_at);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(s
        .set_endpoint_status(&e.id, 2, "failed", Some("still out of memory"))
        .await
        .unwrap());
    let again = s.endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(again.status_reason.as_deref(), Some("still out of memory"));
    assert_eq!(again.updated_at, failed.updated_at);
    assert!(s
        .set_endpoint_status(&e.id, 2, "running", None)
        .await
        .unwrap());
    let running = s.endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(
        (running.status.as_str(), running.status_reason.clone()),
        ("running", None)
    );
    assert!(running.updated_at > failed.updated_at);
}

async fn deleting_then_purging_frees_the_routing_key(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let e = running_endpoint(s, &p, 1, "key").await;
    assert!(s
        .set_endpoint_status(&e.id, 1, "running", Some("2 replicas"))
        .await
        .unwrap());
    let kept = s
        .create_endpoint(new_endpoint(&p, 2, "other-key"))
        .await
        .unwrap();

    // A row that is not being deleted is not purged.
    assert!(!s.purge_endpoint(&e.id).await.unwrap());
    assert!(!s.purge_endpoint(&uuid(404)).await.unwrap());

    let deleting = s.mark_endpoint_deleting(&e.id).await.unwrap();
    assert_eq!(deleting.status, "deleting");
    assert_eq!(deleting.status_reason, None);
    assert_eq!(deleting.generation, 2);
    assert!(deleting.updated_at >= e.updated_at);
    // Still read and listed, so the reconciler stops its replicas.
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), deleting);
    assert_eq!(
        s.list_endpoints(&p).await.unwrap(),
        [deleting.clone(), kept.clone()]
    );
    assert_eq!(ids(&s.all_endpoints().await.unwrap()), [&e.id, &kept.id]);
    assert_eq!(
        s.endpoint_by_routing_key("key").await.unwrap(),
        Some(deleting.clone())
    );

    // It can no longer change, nor be deleted again.
    assert!(matches!(
        s.update_endpoint(&e.id, &flavor("gpu-large")).await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    assert!(matches!(
        s.update_endpoint(
            &e.id,
            &EndpointPatch {
                name: Some("late".to_string()),
                ..Default::default()
            }
        )
        .await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    assert!(matches!(
        s.mark_endpoint_deleting(&e.id).await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    assert!(!s
        .set_endpoint_status(&e.id, 2, "stopped", None)
        .await
        .unwrap());
    assert_eq!(s.endpoint_by_id(&e.id).await.unwrap(), deleting);
    assert!(matches!(
        s.mark_endpoint_deleting(&uuid(404)).await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    // Its routing key is still taken.
    assert!(matches!(
        s.create_endpoint(new_endpoint(&p, 3, "key")).await,
        Err(StoreError::InUse(_))
    ));

    // Purged: gone, and the key is free again.
    assert!(s.purge_endpoint(&e.id).await.unwrap());
    assert!(!s.purge_endpoint(&e.id).await.unwrap());
    assert!(matches!(
        s.endpoint_by_id(&e.id).await,
        Err(StoreError::NotFound("dedicated endpoint"))
    ));
    assert_eq!(s.list_endpoints(&p).await.unwrap(), vec![kept.clone()]);
    assert_eq!(s.all_endpoints().await.unwrap(), vec![kept.clone()]);
    assert_eq!(s.endpoint_by_routing_key("key").await.unwrap(), None);
    let reused = s.create_endpoint(new_endpoint(&p, 3, "key")).await.unwrap();
    assert_eq!(
        s.endpoint_by_routing_key("key").await.unwrap(),
        Some(reused)
    );
    assert_eq!(s.endpoint_by_id(&kept.id).await.unwrap(), kept);
}

async fn routing_keys_find_endpoints_of_any_project(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let mine = s
        .create_endpoint(new_endpoint(&p, 1, "mine"))
        .await
        .unwrap();
    let theirs = s
        .create_endpoint(new_endpoint(&other, 2, "theirs"))
        .await
        .unwrap();
    assert_eq!(s.endpoint_by_routing_key("mine").await.unwrap(), Some(mine));
    assert_eq!(
        s.endpoint_by_routing_key("theirs").await.unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(s.endpoint_by_routing_key("nobody").await.unwrap(), None);
    // Keys are matched exactly.
    assert_eq!(s.endpoint_by_routing_key("Theirs").await.unwrap(), None);
    assert_eq!(s.endpoint_by_routing_key("theirs ").await.unwrap(), None);
    // A patch keeps the key; the row found is the current one.
    let patched = s
        .update_endpoint(&theirs.id, &flavor("gpu-large"))
        .await
        .unwrap();
    assert_eq!(
        s.endpoint_by_routing_key("theirs").await.unwrap(),
        Some(patched)
    );
}

async fn counts_by_status(env: Env) {
    let s = &env.store;
    assert!(s.endpoint_counts_by_status().await.unwrap().is_empty());
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    running_endpoint(s, &p, 1, "a").await;
    running_endpoint(s, &other, 2, "b").await;
    s.create_endpoint(new_endpoint(&p, 3, "c")).await.unwrap();
    let mut disabled = new_endpoint(&other, 4, "d");
    disabled.enabled = false;
    s.create_endpoint(disabled).await.unwrap();
    let doomed = running_endpoint(s, &p, 5, "e").await;
    s.mark_endpoint_deleting(&doomed.id).await.unwrap();

    let counts = |pairs: &[(&str, i64)]| -> Vec<(String, i64)> {
        pairs.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    };
    assert_eq!(
        s.endpoint_counts_by_status().await.unwrap(),
        counts(&[
            ("deleting", 1),
            ("provisioning", 1),
            ("running", 2),
            ("stopped", 1)
        ])
    );
    assert!(s.purge_endpoint(&doomed.id).await.unwrap());
    assert_eq!(
        s.endpoint_counts_by_status().await.unwrap(),
        counts(&[("provisioning", 1), ("running", 2), ("stopped", 1)])
    );
}

async fn concurrent_updates_each_bump_the_generation_once(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let e = running_endpoint(s, &p, 1, "key").await;
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let s = s.clone();
            let id = e.id.clone();
            tokio::spawn(async move { s.update_endpoint(&id, &flavor(&format!("f{i}"))).await })
        })
        .collect();
    let mut applied = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(row) => applied.push(row),
            // Lost to the others more times than it retries.
            Err(StoreError::InUse(_)) => {}
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    assert!(!applied.is_empty());
    // Every update that applied got its own generation.
    let mut generations: Vec<i64> = applied.iter().map(|r| r.generation).collect();
    generations.sort();
    let expected: Vec<i64> = (2..2 + applied.len() as i64).collect();
    assert_eq!(generations, expected);
    let last = applied.iter().max_by_key(|r| r.generation).unwrap();
    let now = s.endpoint_by_id(&e.id).await.unwrap();
    assert_eq!(&now, last);
    assert_eq!(now.status, "updating");
}

async fn a_patch_naming_what_runs_retries_a_failed_endpoint(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let e = s.create_endpoint(new_endpoint(&p, 1, "k")).await.unwrap();
    assert!(s
        .set_endpoint_status(&e.id, e.generation, "failed", Some("no room"))
        .await
        .unwrap());
    // A rename is no retry.
    let renamed = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                name: Some("again".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (renamed.generation, renamed.status.as_str()),
        (e.generation, "failed")
    );
    // `enabled: true` on an enabled, failed endpoint is.
    let retried = s
        .update_endpoint(
            &e.id,
            &EndpointPatch {
                enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(retried.generation, e.generation + 1);
    assert_eq!(retried.status, "provisioning");
    assert_eq!(retried.status_reason, None);
    // On a running endpoint the same patch changes nothing.
    let running = running_endpoint(s, &p, 2, "k2").await;
    let same = s
        .update_endpoint(
            &running.id,
            &EndpointPatch {
                enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (same.generation, same.status.as_str()),
        (running.generation, "running")
    );
}

async fn one_node_runs_an_endpoint_until_its_claim_goes_stale(env: Env) {
    let s = &env.store;
    let project = s.default_project().await.unwrap().id;
    let e = running_endpoint(s, &project, 40, "k40").await;
    let host = |hosts: Vec<hearth_store::EndpointHost>| {
        hosts.into_iter().find(|h| h.id == e.id).expect("listed")
    };
    assert_eq!(host(s.endpoint_hosts().await.unwrap()).node, None);
    // node-a takes it; node-b cannot while node-a's claim is fresh.
    assert!(s.claim_endpoint(&e.id, "node-a", 30, 0).await.unwrap());
    assert!(!s.claim_endpoint(&e.id, "node-b", 30, 0).await.unwrap());
    // node-a renews it with its replicas' count.
    assert!(s.claim_endpoint(&e.id, "node-a", 30, 2).await.unwrap());
    let held = host(s.endpoint_hosts().await.unwrap());
    assert_eq!(
        (held.node.as_deref(), held.ready_replicas),
        (Some("node-a"), 2)
    );
    let now = hearth_store::ids::now();
    assert!(held.held_elsewhere("node-b", now, 30));
    assert!(!held.held_elsewhere("node-a", now, 30));
    assert!(!held.held_elsewhere("node-b", now + 31, 30));
    // Stale (a zero-second lease, a second later): node-b takes it over.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(s.claim_endpoint(&e.id, "node-b", 0, 0).await.unwrap());
    assert!(!s.claim_endpoint(&e.id, "node-a", 30, 2).await.unwrap());
    // A clean shutdown gives back only the node's own.
    let other = running_endpoint(s, &project, 41, "k41").await;
    assert!(s.claim_endpoint(&other.id, "node-a", 30, 1).await.unwrap());
    assert_eq!(s.release_endpoints("node-b").await.unwrap(), 1);
    assert_eq!(host(s.endpoint_hosts().await.unwrap()).node, None);
    assert!(s.claim_endpoint(&e.id, "node-c", 30, 0).await.unwrap());
    // One endpoint given back by its holder only.
    assert!(!s.release_endpoint(&e.id, "node-a").await.unwrap());
    assert!(s.release_endpoint(&e.id, "node-c").await.unwrap());
    assert!(s.claim_endpoint(&e.id, "node-a", 30, 0).await.unwrap());
    // A deleting endpoint is claimed by nobody.
    s.mark_endpoint_deleting(&other.id).await.unwrap();
    assert!(!s.claim_endpoint(&other.id, "node-a", 30, 1).await.unwrap());
}
