//! Batch repository tests: batches (create, scope, list, cancel, claim,
//! heartbeat, release, start, fail, finish), their recorded results, and the
//! input files they hold. Each runs on SQLite, and on PostgreSQL when
//! `HEARTH_TEST_DATABASE_URL` names a server (a fresh database per test).

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::{Batch, BatchClaimRules, BatchResult, BatchStatus, NewBatch, Store, StoreError};
use serde_json::json;

on_both!(
    batches_are_created_scoped_and_listed,
    cancel_rules,
    concurrent_claims_take_a_batch_once,
    stale_and_own_batches_are_reclaimed,
    attempts_are_bounded,
    validation_starts_or_fails_a_batch,
    results_are_recorded_once,
    a_worker_that_lost_the_claim_writes_nothing,
    finish_sets_files_and_drops_results,
    input_files_of_running_batches_cannot_be_deleted,
);

fn new_batch(project: &str, input_file_id: &str) -> NewBatch {
    NewBatch {
        project_id: project.to_string(),
        endpoint: "/v1/chat/completions".to_string(),
        completion_window: "24h".to_string(),
        input_file_id: input_file_id.to_string(),
        metadata: None,
        override_settings: None,
        expires_at: hearth_store::ids::now() + 86_400,
    }
}

fn result(line: i64, ok: bool) -> BatchResult {
    BatchResult {
        line,
        ok,
        body: format!(r#"{{"custom_id":"r{line}","ok":{ok}}}"#),
    }
}

/// Claims the next batch for `worker`, which must be `id`.
async fn claim(s: &Store, worker: &str, id: &str) -> Batch {
    let batch = s
        .claim_batch(&BatchClaimRules::new(worker, 60))
        .await
        .unwrap()
        .expect("a batch to claim");
    assert_eq!(batch.id, id);
    batch
}

/// A batch of `project` claimed by `worker` and `in_progress` with `total`
/// requests.
async fn running_batch(s: &Store, project: &str, worker: &str, total: i64) -> Batch {
    let batch = s.create_batch(new_batch(project, "file-in")).await.unwrap();
    claim(s, worker, &batch.id).await;
    assert!(s
        .start_batch(&batch.id, worker, "smol", total)
        .await
        .unwrap());
    s.batch_by_id(&batch.id).await.unwrap()
}

fn ids(batches: &[Batch]) -> Vec<&str> {
    batches.iter().map(|b| b.id.as_str()).collect()
}

async fn batches_are_created_scoped_and_listed(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let mut new = new_batch(&p, "file-a");
    new.metadata = Some(json!({"purpose": "nightly"}));
    new.override_settings = Some(json!({"temperature": 0}));
    let expires_at = new.expires_at;
    let batch = s.create_batch(new).await.unwrap();
    assert!(batch.id.starts_with("batch-"), "{}", batch.id);
    assert!(hearth_store::batches::is_well_formed_batch_id(&batch.id));
    assert_eq!(batch.status, BatchStatus::Validating);
    assert_eq!((batch.total, batch.completed, batch.failed), (0, 0, 0));
    assert_eq!((batch.attempts, batch.claimed_by.clone()), (0, None));
    assert_eq!(batch.expires_at, expires_at);
    assert_eq!(batch.metadata, Some(json!({"purpose": "nightly"})));
    assert_eq!(batch.override_settings, Some(json!({"temperature": 0})));
    assert_eq!(
        (
            batch.model.clone(),
            batch.errors.clone(),
            batch.in_progress_at
        ),
        (None, None, None)
    );
    // What was stored reads back the same, whatever the caller's project.
    assert_eq!(s.batch_by_id(&batch.id).await.unwrap(), batch);
    assert!(matches!(
        s.batch_by_id("batch-missing").await,
        Err(StoreError::NotFound("batch"))
    ));
    // A batch of an unknown project is refused.
    assert!(s
        .create_batch(new_batch("project-missing", "file-a"))
        .await
        .is_err());

    // Paging: newest first, `after` = an id gives the older ones, and the
    // input file filters.
    let mut all = vec![batch.id.clone()];
    for i in 0..4 {
        let file = if i % 2 == 0 { "file-b" } else { "file-a" };
        all.push(s.create_batch(new_batch(&p, file)).await.unwrap().id);
    }
    s.create_batch(new_batch(&other, "file-a")).await.unwrap();
    all.reverse(); // [b4(a), b3(b), b2(a), b1(b), b0(a)]
    let (page1, more) = s.list_batches(&p, 2, None, None).await.unwrap();
    assert!(more);
    assert_eq!(ids(&page1), [&all[0], &all[1]]);
    let (page2, more) = s.list_batches(&p, 2, Some(&all[1]), None).await.unwrap();
    assert!(more);
    assert_eq!(ids(&page2), [&all[2], &all[3]]);
    let (page3, more) = s.list_batches(&p, 2, Some(&all[3]), None).await.unwrap();
    assert!(!more);
    assert_eq!(ids(&page3), [&all[4]]);
    assert_eq!(page3[0], batch);
    let (every, more) = s.list_batches(&p, 5, None, None).await.unwrap();
    assert!(!more);
    assert_eq!(every.len(), 5);
    let (of_a, more) = s.list_batches(&p, 2, None, Some("file-a")).await.unwrap();
    assert!(more);
    assert_eq!(ids(&of_a), [&all[0], &all[2]]);
    let (rest, more) = s
        .list_batches(&p, 2, Some(&all[2]), Some("file-a"))
        .await
        .unwrap();
    assert!(!more);
    assert_eq!(ids(&rest), [&all[4]]);
    let (of_b, more) = s.list_batches(&p, 10, None, Some("file-b")).await.unwrap();
    assert!(!more);
    assert_eq!(ids(&of_b), [&all[1], &all[3]]);
    assert!(s
        .list_batches(&p, 10, None, Some("file-z"))
        .await
        .unwrap()
        .0
        .is_empty());
    let (none, more) = s.list_batches(&p, 0, None, None).await.unwrap();
    assert!(none.is_empty() && more);
    assert_eq!(
        s.list_batches(&other, 10, None, None)
            .await
            .unwrap()
            .0
            .len(),
        1
    );
    assert_eq!(
        s.batch_counts_by_status().await.unwrap(),
        vec![(BatchStatus::Validating, 6)]
    );
}

async fn cancel_rules(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    // No worker holds it yet: cancelled at once.
    let fresh = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    assert!(matches!(
        s.cancel_batch(&other, &fresh.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.cancel_batch(&p, "batch-missing").await,
        Err(StoreError::NotFound(_))
    ));
    let cancelled = s.cancel_batch(&p, &fresh.id).await.unwrap();
    assert_eq!(cancelled.status, BatchStatus::Cancelled);
    assert!(cancelled.cancelled_at.is_some());
    assert_eq!(cancelled.cancelling_at, cancelled.cancelled_at);
    // Again: returned as it is; never claimed.
    assert_eq!(s.cancel_batch(&p, &fresh.id).await.unwrap(), cancelled);
    assert_eq!(
        s.claim_batch(&BatchClaimRules::new("w1", 60))
            .await
            .unwrap(),
        None
    );

    // Held while validating: cancelling, and its worker ends it.
    let held = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    claim(s, "w1", &held.id).await;
    let cancelling = s.cancel_batch(&p, &held.id).await.unwrap();
    assert_eq!(cancelling.status, BatchStatus::Cancelling);
    assert!(cancelling.cancelling_at.is_some());
    assert_eq!(cancelling.cancelled_at, None);
    assert_eq!(cancelling.claimed_by.as_deref(), Some("w1"));
    assert_eq!(
        s.heartbeat_batch(&held.id, "w1").await.unwrap(),
        Some(BatchStatus::Cancelling)
    );
    assert!(!s.start_batch(&held.id, "w1", "smol", 3).await.unwrap());
    // Cancelling again changes nothing (the heartbeat above may have moved
    // `heartbeat_at` to the next second).
    let again = s.cancel_batch(&p, &held.id).await.unwrap();
    assert_eq!(
        Batch {
            heartbeat_at: cancelling.heartbeat_at,
            ..again
        },
        cancelling
    );
    assert!(s
        .finish_batch(&held.id, "w1", BatchStatus::Cancelled, None, None)
        .await
        .unwrap());
    assert_eq!(
        s.batch_by_id(&held.id).await.unwrap().status,
        BatchStatus::Cancelled
    );

    // In progress: cancelling.
    let running = running_batch(s, &p, "w1", 3).await;
    let cancelling = s.cancel_batch(&p, &running.id).await.unwrap();
    assert_eq!(cancelling.status, BatchStatus::Cancelling);
    assert_eq!(cancelling.cancelled_at, None);
    // Its worker may still record what finished, not finalize or complete.
    assert!(s
        .add_batch_result(&running.id, "w1", &result(1, true))
        .await
        .unwrap());
    assert!(!s.finalize_batch(&running.id, "w1").await.unwrap());
    assert!(!s
        .finish_batch(&running.id, "w1", BatchStatus::Completed, None, None)
        .await
        .unwrap());
    assert!(!s
        .finish_batch(&running.id, "w1", BatchStatus::Expired, None, None)
        .await
        .unwrap());
    assert!(s
        .finish_batch(
            &running.id,
            "w1",
            BatchStatus::Cancelled,
            Some("file-out"),
            None
        )
        .await
        .unwrap());
    let ended = s.batch_by_id(&running.id).await.unwrap();
    assert_eq!(ended.status, BatchStatus::Cancelled);
    assert_eq!(ended.completed, 1);
    assert_eq!(ended.output_file_id.as_deref(), Some("file-out"));
    assert!(ended.cancelled_at.is_some());
    assert_eq!(ended.claimed_by, None);

    // Over (or finalizing): cannot be cancelled.
    let done = running_batch(s, &p, "w1", 1).await;
    assert!(s.finalize_batch(&done.id, "w1").await.unwrap());
    match s.cancel_batch(&p, &done.id).await {
        Err(StoreError::Invalid(message)) => {
            assert_eq!(message, "cannot cancel a batch that is finalizing")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(s
        .finish_batch(&done.id, "w1", BatchStatus::Completed, None, None)
        .await
        .unwrap());
    match s.cancel_batch(&p, &done.id).await {
        Err(StoreError::Invalid(message)) => {
            assert_eq!(message, "cannot cancel a batch that is completed")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(matches!(
        s.cancel_batch(&other, &done.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(
        s.batch_by_id(&done.id).await.unwrap().status,
        BatchStatus::Completed
    );
    let mut counts = s.batch_counts_by_status().await.unwrap();
    counts.sort_by_key(|(status, _)| status.as_str());
    assert_eq!(
        counts,
        vec![(BatchStatus::Cancelled, 3), (BatchStatus::Completed, 1)]
    );
}

async fn concurrent_claims_take_a_batch_once(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    for round in 0..5 {
        let batch = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
        let mut tasks = Vec::new();
        for w in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.claim_batch(&BatchClaimRules::new(&format!("worker-{w}"), 600))
                    .await
                    .unwrap()
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            winners.extend(t.await.unwrap());
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let won = &winners[0];
        assert_eq!(won.id, batch.id);
        assert_eq!(won.status, BatchStatus::Validating);
        assert_eq!(won.attempts, 1);
        assert!(won.heartbeat_at.is_some());
        let stored = s.batch_by_id(&batch.id).await.unwrap();
        assert_eq!(stored.claimed_by, won.claimed_by);
        // Nothing else to claim for anyone else.
        assert_eq!(
            s.claim_batch(&BatchClaimRules::new("worker-x", 600))
                .await
                .unwrap(),
            None
        );
        // Over, so that the winner does not take it back next round.
        let worker = won.claimed_by.clone().unwrap();
        assert!(s.fail_batch(&batch.id, &worker, json!([])).await.unwrap());
    }
    // Many claimers, many batches: each batch goes to exactly one.
    let mut all = Vec::new();
    for _ in 0..6 {
        all.push(s.create_batch(new_batch(&p, "file-a")).await.unwrap().id);
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.claim_batch(&BatchClaimRules::new(&format!("w{w}"), 600))
                .await
                .unwrap()
        }));
    }
    let mut claimed: Vec<String> = Vec::new();
    for t in tasks {
        if let Some(batch) = t.await.unwrap() {
            claimed.push(batch.id);
        }
    }
    claimed.sort();
    assert_eq!(claimed, all);
}

async fn stale_and_own_batches_are_reclaimed(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let old = running_batch(s, &p, "w1", 4).await;
    assert_eq!(old.claimed_by.as_deref(), Some("w1"));
    assert_eq!(old.attempts, 1);
    // Fresh heartbeat: another worker cannot take it.
    assert_eq!(
        s.claim_batch(&BatchClaimRules::new("w2", 60))
            .await
            .unwrap(),
        None
    );
    // While w1 runs it, w1 does not claim it a second time.
    let running = vec![old.id.clone()];
    let here = BatchClaimRules {
        running_here: &running,
        ..BatchClaimRules::new("w1", 60)
    };
    assert_eq!(s.claim_batch(&here).await.unwrap(), None);
    // But the same worker, restarted, takes its own batch back, status
    // kept.
    let again = claim(s, "w1", &old.id).await;
    assert_eq!((again.status, again.attempts), (BatchStatus::InProgress, 2));
    // The running one is skipped for the next.
    let queued = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    assert_eq!(s.claim_batch(&here).await.unwrap().unwrap().id, queued.id);
    // With a zero tolerance, a heartbeat from an earlier second is stale.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let stolen = s
        .claim_batch(&BatchClaimRules::new("w3", 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stolen.id, old.id, "the oldest stale batch first");
    assert_eq!(stolen.claimed_by.as_deref(), Some("w3"));
    assert_eq!(
        (stolen.status, stolen.attempts),
        (BatchStatus::InProgress, 3)
    );
    // The old worker learns it lost the batch; the new one keeps it.
    assert_eq!(s.heartbeat_batch(&old.id, "w1").await.unwrap(), None);
    assert_eq!(
        s.heartbeat_batch(&old.id, "w3").await.unwrap(),
        Some(BatchStatus::InProgress)
    );
    assert_eq!(
        s.heartbeat_batch("batch-missing", "w3").await.unwrap(),
        None
    );

    // A shutdown in good order gives it back, the attempt not counted;
    // only its holder can.
    assert!(!s.release_batch(&old.id, "w1").await.unwrap());
    assert!(s.release_batch(&old.id, "w3").await.unwrap());
    let back = s.batch_by_id(&old.id).await.unwrap();
    assert_eq!(
        (
            back.status,
            back.attempts,
            back.claimed_by,
            back.heartbeat_at
        ),
        (BatchStatus::InProgress, 2, None, None)
    );
    assert_eq!(s.heartbeat_batch(&old.id, "w3").await.unwrap(), None);
    let taken = claim(s, "w4", &old.id).await;
    assert_eq!((taken.status, taken.attempts), (BatchStatus::InProgress, 3));
}

async fn attempts_are_bounded(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let batch = running_batch(s, &p, "w1", 2).await;
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(1, true))
        .await
        .unwrap());
    // Claimed again twice (its worker restarting each time): attempts 2, 3.
    for attempt in 2..=3 {
        assert_eq!(claim(s, "w1", &batch.id).await.attempts, attempt);
    }
    // The fourth claim fails it, and takes the next batch instead.
    let next = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    assert_eq!(claim(s, "w1", &next.id).await.attempts, 1);
    let failed = s.batch_by_id(&batch.id).await.unwrap();
    assert_eq!(failed.status, BatchStatus::Failed);
    assert!(failed.failed_at.is_some());
    assert_eq!((failed.claimed_by, failed.heartbeat_at), (None, None));
    let errors = failed.errors.unwrap();
    assert_eq!(errors[0]["code"], "too_many_attempts", "{errors}");
    assert_eq!(errors[0]["line"], json!(null), "{errors}");
    assert!(
        errors[0]["message"].as_str().unwrap().contains("3 times"),
        "{errors}"
    );
    assert!(s.batch_result_lines(&batch.id).await.unwrap().is_empty());
    // A lower bound applies the same way, whatever the status.
    let strict = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    assert!(s.fail_batch(&next.id, "w1", json!([])).await.unwrap());
    let rules = BatchClaimRules {
        max_attempts: 1,
        ..BatchClaimRules::new("w2", 60)
    };
    assert_eq!(s.claim_batch(&rules).await.unwrap().unwrap().id, strict.id);
    assert_eq!(
        s.cancel_batch(&p, &strict.id).await.unwrap().status,
        BatchStatus::Cancelling
    );
    assert_eq!(s.claim_batch(&rules).await.unwrap(), None);
    assert_eq!(
        s.batch_by_id(&strict.id).await.unwrap().status,
        BatchStatus::Failed
    );
}

async fn validation_starts_or_fails_a_batch(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let good = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    // Not claimed: nothing applies.
    assert!(!s.start_batch(&good.id, "w1", "smol", 3).await.unwrap());
    claim(s, "w1", &good.id).await;
    assert!(!s.start_batch(&good.id, "w2", "smol", 3).await.unwrap());
    assert!(!s.finalize_batch(&good.id, "w1").await.unwrap());
    assert!(!s
        .add_batch_result(&good.id, "w1", &result(1, true))
        .await
        .unwrap());
    assert!(s.start_batch(&good.id, "w1", "smol", 3).await.unwrap());
    let started = s.batch_by_id(&good.id).await.unwrap();
    assert_eq!(started.status, BatchStatus::InProgress);
    assert_eq!((started.model.as_deref(), started.total), (Some("smol"), 3));
    assert!(started.in_progress_at.is_some());
    // Started once.
    assert!(!s.start_batch(&good.id, "w1", "other", 9).await.unwrap());

    // (w1 would take its own `good` back first: another worker.)
    let bad = s.create_batch(new_batch(&p, "file-a")).await.unwrap();
    claim(s, "w2", &bad.id).await;
    let errors =
        json!([{"code": "invalid_request", "message": "Line 2: bad", "param": null, "line": 2}]);
    assert!(!s.fail_batch(&bad.id, "w1", errors.clone()).await.unwrap());
    assert!(s.fail_batch(&bad.id, "w2", errors.clone()).await.unwrap());
    let failed = s.batch_by_id(&bad.id).await.unwrap();
    assert_eq!(failed.status, BatchStatus::Failed);
    assert_eq!(failed.errors, Some(errors.clone()));
    assert!(failed.failed_at.is_some());
    assert_eq!(failed.claimed_by, None);
    assert!(!s.fail_batch(&bad.id, "w2", errors).await.unwrap());
    assert_eq!(s.heartbeat_batch(&bad.id, "w2").await.unwrap(), None);
    // Only `in_progress` and `validating` batches fail.
    assert!(s.finalize_batch(&good.id, "w1").await.unwrap());
    assert!(!s.fail_batch(&good.id, "w1", json!([])).await.unwrap());
    // Finalizing again (resumed there) keeps the first time.
    let finalizing = s.batch_by_id(&good.id).await.unwrap();
    assert_eq!(finalizing.status, BatchStatus::Finalizing);
    assert!(finalizing.finalizing_at.is_some());
    assert!(s.finalize_batch(&good.id, "w1").await.unwrap());
    assert_eq!(s.batch_by_id(&good.id).await.unwrap(), finalizing);
}

async fn results_are_recorded_once(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let batch = running_batch(s, &p, "w1", 7).await;
    let other = running_batch(s, &p, "w2", 1).await;
    for (line, ok) in [(5, true), (1, false), (3, true), (2, true), (7, false)] {
        assert!(s
            .add_batch_result(&batch.id, "w1", &result(line, ok))
            .await
            .unwrap());
    }
    assert!(s
        .add_batch_result(&other.id, "w2", &result(1, true))
        .await
        .unwrap());
    // Again (a resumed batch ran the line twice): not recorded or counted
    // a second time, the first body kept.
    let mut replay = result(5, false);
    replay.body = "a different body".into();
    assert!(s.add_batch_result(&batch.id, "w1", &replay).await.unwrap());
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(1, false))
        .await
        .unwrap());
    let counted = s.batch_by_id(&batch.id).await.unwrap();
    assert_eq!((counted.completed, counted.failed), (3, 2));
    assert_eq!(
        s.batch_result_lines(&batch.id).await.unwrap(),
        vec![1, 2, 3, 5, 7]
    );
    // Paged in line order.
    let page1 = s.batch_results(&batch.id, -1, 2).await.unwrap();
    assert_eq!(page1, vec![result(1, false), result(2, true)]);
    let page2 = s.batch_results(&batch.id, 2, 2).await.unwrap();
    assert_eq!(page2, vec![result(3, true), result(5, true)]);
    let page3 = s.batch_results(&batch.id, 5, 2).await.unwrap();
    assert_eq!(page3, vec![result(7, false)]);
    assert!(s.batch_results(&batch.id, 7, 2).await.unwrap().is_empty());
    assert_eq!(s.batch_results(&other.id, -1, 10).await.unwrap().len(), 1);
    // Concurrent writers of the same lines count each once.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (s, id) = (s.clone(), batch.id.clone());
        tasks.push(tokio::spawn(async move {
            for line in [4, 6] {
                assert!(s
                    .add_batch_result(&id, "w1", &result(line, true))
                    .await
                    .unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counted = s.batch_by_id(&batch.id).await.unwrap();
    assert_eq!((counted.completed, counted.failed), (5, 2));
    assert_eq!(
        s.batch_result_lines(&batch.id).await.unwrap(),
        vec![1, 2, 3, 4, 5, 6, 7]
    );
    // Still recorded while finalizing.
    assert!(s.finalize_batch(&batch.id, "w1").await.unwrap());
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(8, true))
        .await
        .unwrap());
    assert_eq!(s.batch_by_id(&batch.id).await.unwrap().completed, 6);
}

async fn a_worker_that_lost_the_claim_writes_nothing(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let batch = running_batch(s, &p, "w1", 3).await;
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(1, true))
        .await
        .unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let stolen = s
        .claim_batch(&BatchClaimRules::new("w2", 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stolen.id, batch.id);
    // w1's writes all refuse, and change nothing.
    assert!(!s
        .add_batch_result(&batch.id, "w1", &result(2, true))
        .await
        .unwrap());
    assert!(!s
        .add_batch_result(&batch.id, "w1", &result(1, false))
        .await
        .unwrap());
    assert_eq!(s.heartbeat_batch(&batch.id, "w1").await.unwrap(), None);
    assert!(!s.release_batch(&batch.id, "w1").await.unwrap());
    assert!(!s.fail_batch(&batch.id, "w1", json!([])).await.unwrap());
    assert!(!s.finalize_batch(&batch.id, "w1").await.unwrap());
    assert!(!s
        .finish_batch(
            &batch.id,
            "w1",
            BatchStatus::Completed,
            Some("file-x"),
            None
        )
        .await
        .unwrap());
    assert!(!s
        .finish_batch(&batch.id, "w1", BatchStatus::Expired, None, None)
        .await
        .unwrap());
    let now = s.batch_by_id(&batch.id).await.unwrap();
    assert_eq!(now, stolen);
    assert_eq!((now.completed, now.failed), (1, 0));
    assert_eq!(s.batch_result_lines(&batch.id).await.unwrap(), vec![1]);
    // The new holder carries on.
    assert!(s
        .add_batch_result(&batch.id, "w2", &result(2, false))
        .await
        .unwrap());
    assert_eq!(s.batch_result_lines(&batch.id).await.unwrap(), vec![1, 2]);
}

async fn finish_sets_files_and_drops_results(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let batch = running_batch(s, &p, "w1", 2).await;
    // Not a way to end.
    for status in [
        BatchStatus::Failed,
        BatchStatus::InProgress,
        BatchStatus::Validating,
        BatchStatus::Finalizing,
        BatchStatus::Cancelling,
    ] {
        assert!(matches!(
            s.finish_batch(&batch.id, "w1", status, None, None).await,
            Err(StoreError::Invalid(_))
        ));
    }
    // Cancelled only from cancelling.
    assert!(!s
        .finish_batch(&batch.id, "w1", BatchStatus::Cancelled, None, None)
        .await
        .unwrap());
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(1, true))
        .await
        .unwrap());
    assert!(s
        .add_batch_result(&batch.id, "w1", &result(2, false))
        .await
        .unwrap());
    assert!(s.finalize_batch(&batch.id, "w1").await.unwrap());
    assert!(s
        .finish_batch(
            &batch.id,
            "w1",
            BatchStatus::Completed,
            Some("file-out"),
            Some("file-err")
        )
        .await
        .unwrap());
    let done = s.batch_by_id(&batch.id).await.unwrap();
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(
        (
            done.output_file_id.as_deref(),
            done.error_file_id.as_deref()
        ),
        (Some("file-out"), Some("file-err"))
    );
    assert!(done.completed_at.is_some() && done.finalizing_at.is_some());
    assert_eq!((done.expired_at, done.cancelled_at), (None, None));
    assert_eq!((done.completed, done.failed, done.total), (1, 1, 2));
    assert_eq!((done.claimed_by, done.heartbeat_at), (None, None));
    assert!(s.batch_result_lines(&batch.id).await.unwrap().is_empty());
    // Finished once: never again, nor claimed.
    assert!(!s
        .finish_batch(&batch.id, "w1", BatchStatus::Expired, None, None)
        .await
        .unwrap());
    assert_eq!(s.heartbeat_batch(&batch.id, "w1").await.unwrap(), None);
    assert_eq!(
        s.claim_batch(&BatchClaimRules::new("w1", 0)).await.unwrap(),
        None
    );

    // Expired, from in_progress, with only an error file.
    let late = running_batch(s, &p, "w1", 5).await;
    assert!(s
        .add_batch_result(&late.id, "w1", &result(1, true))
        .await
        .unwrap());
    assert!(s
        .finish_batch(
            &late.id,
            "w1",
            BatchStatus::Expired,
            None,
            Some("file-err2")
        )
        .await
        .unwrap());
    let expired = s.batch_by_id(&late.id).await.unwrap();
    assert_eq!(expired.status, BatchStatus::Expired);
    assert!(expired.expired_at.is_some());
    assert_eq!(expired.completed_at, None);
    assert_eq!(
        (expired.output_file_id, expired.error_file_id.as_deref()),
        (None, Some("file-err2"))
    );
    assert!(s.batch_results(&late.id, -1, 10).await.unwrap().is_empty());

    // Completed straight from in_progress.
    let quick = running_batch(s, &p, "w1", 0).await;
    assert!(s
        .finish_batch(&quick.id, "w1", BatchStatus::Completed, None, None)
        .await
        .unwrap());
    assert_eq!(
        s.batch_by_id(&quick.id).await.unwrap().status,
        BatchStatus::Completed
    );
}

async fn input_files_of_running_batches_cannot_be_deleted(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let input = s
        .create_file_from_bytes(&p, "in.jsonl", "batch", b"{}\n")
        .await
        .unwrap();
    let spare = s
        .create_file_from_bytes(&p, "spare.jsonl", "batch", b"{}\n")
        .await
        .unwrap();
    assert!(s.file_users(&input.id).await.unwrap().is_empty());
    let first = s.create_batch(new_batch(&p, &input.id)).await.unwrap();
    let second = s.create_batch(new_batch(&p, &input.id)).await.unwrap();
    assert_eq!(
        s.file_users(&input.id).await.unwrap(),
        vec![first.id.clone(), second.id.clone()]
    );
    assert!(s.file_users(&spare.id).await.unwrap().is_empty());
    match s.delete_file(&p, &input.id).await {
        Err(StoreError::InUse(message)) => {
            assert!(message.contains(&first.id), "{message}");
            assert!(message.contains(&second.id), "{message}");
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    // Running, cancelling: still in use.
    claim(s, "w1", &first.id).await;
    assert!(s.start_batch(&first.id, "w1", "smol", 1).await.unwrap());
    s.cancel_batch(&p, &second.id).await.unwrap();
    assert_eq!(
        s.file_users(&input.id).await.unwrap(),
        vec![first.id.clone()]
    );
    s.cancel_batch(&p, &first.id).await.unwrap();
    assert!(matches!(
        s.delete_file(&p, &input.id).await,
        Err(StoreError::InUse(_))
    ));
    // Once every batch is over, the file may go.
    assert!(s
        .finish_batch(&first.id, "w1", BatchStatus::Cancelled, None, None)
        .await
        .unwrap());
    assert!(s.file_users(&input.id).await.unwrap().is_empty());
    s.delete_file(&p, &input.id).await.unwrap();
    assert_eq!(s.blobs().file_ids().await.unwrap(), vec![spare.id.clone()]);
    // The batches still read back, their input file gone.
    assert_eq!(
        s.batch_by_id(&first.id).await.unwrap().input_file_id,
        input.id
    );
}
