//! Fine-tuning repository tests: jobs (create, scope, list, cancel, claim,
//! heartbeat, finish), events and checkpoints, the files they hold, and the
//! blobs they keep. Each runs on SQLite, and on PostgreSQL when
//! `HEARTH_TEST_DATABASE_URL` names a server (a fresh database per test).

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::{ClaimRules, FtStatus, NewFtJob, StoreError};
use serde_json::json;

on_both!(
    jobs_are_created_scoped_and_listed,
    cancel_is_immediate_and_final,
    concurrent_claims_take_a_job_once,
    stale_and_own_jobs_are_reclaimed,
    claims_skip_running_and_unserved_jobs,
    attempts_are_bounded,
    cancelled_jobs_stop_their_worker,
    finish_records_results,
    events_and_checkpoints_page_newest_first,
    sweep_keeps_fine_tuning_blobs,
    files_of_active_jobs_cannot_be_deleted,
    server_written_files,
);

fn new_job(project: &str, training_file: &str) -> NewFtJob {
    NewFtJob {
        project_id: project.to_string(),
        model: "HuggingFaceTB/SmolLM2-135M-Instruct".to_string(),
        training_file: training_file.to_string(),
        validation_file: None,
        suffix: Some("mine".to_string()),
        seed: 42,
        hyperparameters: json!({"n_epochs": 3, "learning_rate": 1e-4}),
        method: "supervised".to_string(),
        metadata: None,
    }
}

async fn jobs_are_created_scoped_and_listed(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    assert!(job.id.starts_with("ftjob-"), "{}", job.id);
    assert!(hearth_store::fine_tuning::is_well_formed_job_id(&job.id));
    assert_eq!(job.status, FtStatus::Queued);
    assert_eq!(job.trained_steps, 0);
    assert_eq!(job.result_files, Vec::<String>::new());
    assert_eq!((job.finished_at, job.claimed_by.clone()), (None, None));
    // What was stored reads back the same.
    assert_eq!(s.ft_job(&p, &job.id).await.unwrap(), job);
    assert_eq!(s.ft_job_by_id(&job.id).await.unwrap(), job);
    assert_eq!(job.hyperparameters["n_epochs"], 3);
    assert_eq!(job.suffix.as_deref(), Some("mine"));
    assert_eq!(job.seed, 42);
    // Another project's job looks missing.
    assert!(matches!(
        s.ft_job(&other, &job.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.ft_job(&p, "ftjob-missing").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.cancel_ft_job(&other, &job.id).await,
        Err(StoreError::NotFound(_))
    ));
    // The creation event.
    let (events, more) = s.list_ft_events(&job.id, 10, None).await.unwrap();
    assert!(!more);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].message, "Created fine-tuning job");
    assert_eq!(
        (events[0].level.as_str(), events[0].kind.as_str()),
        ("info", "message")
    );

    // Paging: newest first, `after` = an id gives the older ones.
    let mut ids = vec![job.id.clone()];
    for _ in 0..4 {
        ids.push(s.create_ft_job(new_job(&p, "file-a")).await.unwrap().id);
    }
    s.create_ft_job(new_job(&other, "file-b")).await.unwrap();
    ids.reverse();
    let (page1, more) = s.list_ft_jobs(&p, 2, None).await.unwrap();
    assert!(more);
    assert_eq!(
        page1.iter().map(|j| &j.id).collect::<Vec<_>>(),
        vec![&ids[0], &ids[1]]
    );
    let (page2, more) = s.list_ft_jobs(&p, 2, Some(&ids[1])).await.unwrap();
    assert!(more);
    assert_eq!(
        page2.iter().map(|j| &j.id).collect::<Vec<_>>(),
        vec![&ids[2], &ids[3]]
    );
    let (page3, more) = s.list_ft_jobs(&p, 2, Some(&ids[3])).await.unwrap();
    assert!(!more);
    assert_eq!(
        page3.iter().map(|j| &j.id).collect::<Vec<_>>(),
        vec![&ids[4]]
    );
    let (all, more) = s.list_ft_jobs(&p, 5, None).await.unwrap();
    assert!(!more);
    assert_eq!(all.len(), 5);
    assert_eq!(s.list_ft_jobs(&other, 10, None).await.unwrap().0.len(), 1);
}

async fn cancel_is_immediate_and_final(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let cancelled = s.cancel_ft_job(&p, &job.id).await.unwrap();
    assert_eq!(cancelled.status, FtStatus::Cancelled);
    assert!(cancelled.finished_at.is_some());
    // Again: returned as it is, no second event.
    assert_eq!(s.cancel_ft_job(&p, &job.id).await.unwrap(), cancelled);
    let (events, _) = s.list_ft_events(&job.id, 10, None).await.unwrap();
    let messages: Vec<_> = events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        vec!["Fine-tuning job cancelled", "Created fine-tuning job"]
    );
    // A cancelled job is never claimed.
    assert_eq!(
        s.claim_ft_job(&ClaimRules::new("w1", 60)).await.unwrap(),
        None
    );

    // A succeeded job cannot be cancelled.
    let done = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert!(s
        .finish_ft_job(
            &done.id,
            "w1",
            FtStatus::Succeeded,
            Some("ft:m:x"),
            &[],
            None
        )
        .await
        .unwrap());
    match s.cancel_ft_job(&p, &done.id).await {
        Err(StoreError::Invalid(message)) => {
            assert!(message.contains("already succeeded"), "{message}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(
        s.ft_job(&p, &done.id).await.unwrap().status,
        FtStatus::Succeeded
    );
}

async fn concurrent_claims_take_a_job_once(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    for round in 0..5 {
        let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
        let (a, b) = tokio::join!(
            tokio::spawn({
                let s = s.clone();
                async move {
                    s.claim_ft_job(&ClaimRules::new("worker-a", 600))
                        .await
                        .unwrap()
                }
            }),
            tokio::spawn({
                let s = s.clone();
                async move {
                    s.claim_ft_job(&ClaimRules::new("worker-b", 600))
                        .await
                        .unwrap()
                }
            }),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let winners: Vec<_> = [a, b].into_iter().flatten().collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let won = &winners[0];
        assert_eq!(won.id, job.id);
        assert_eq!(won.status, FtStatus::Running);
        assert!(won.heartbeat_at.is_some());
        let stored = s.ft_job_by_id(&job.id).await.unwrap();
        assert_eq!(stored.claimed_by, won.claimed_by);
        // Nothing else to claim for anyone.
        assert_eq!(
            s.claim_ft_job(&ClaimRules::new("worker-c", 600))
                .await
                .unwrap(),
            None
        );
        // Over, so that the winner does not take it back next round.
        s.cancel_ft_job(&p, &job.id).await.unwrap();
    }
    // Many claimers, many jobs: each job goes to exactly one.
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(s.create_ft_job(new_job(&p, "file-a")).await.unwrap().id);
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.claim_ft_job(&ClaimRules::new(&format!("w{w}"), 600))
                .await
                .unwrap()
        }));
    }
    let mut claimed: Vec<String> = Vec::new();
    for t in tasks {
        if let Some(job) = t.await.unwrap() {
            claimed.push(job.id);
        }
    }
    claimed.sort();
    assert_eq!(claimed, ids);
}

async fn stale_and_own_jobs_are_reclaimed(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let old = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let claimed = s
        .claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, old.id);
    assert_eq!(claimed.claimed_by.as_deref(), Some("w1"));
    // Fresh heartbeat: another worker cannot take it.
    assert_eq!(
        s.claim_ft_job(&ClaimRules::new("w2", 60)).await.unwrap(),
        None
    );
    // But the same worker (restarted) takes its own job back.
    let again = s
        .claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.id, old.id);
    // A queued job is taken before nothing; the running one is older.
    let queued = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    assert_eq!(
        s.claim_ft_job(&ClaimRules::new("w2", 60))
            .await
            .unwrap()
            .unwrap()
            .id,
        queued.id
    );
    // With a zero tolerance, a heartbeat from an earlier second is stale.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let stolen = s
        .claim_ft_job(&ClaimRules::new("w3", 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stolen.id, old.id, "the oldest stale job first");
    assert_eq!(stolen.claimed_by.as_deref(), Some("w3"));
    assert_eq!(stolen.status, FtStatus::Running);
    // The old worker learns it lost the job, and can no longer write to it.
    assert!(!s.heartbeat_ft_job(&old.id, "w1").await.unwrap());
    assert!(s.heartbeat_ft_job(&old.id, "w3").await.unwrap());
    assert!(!s
        .update_ft_progress(&old.id, "w1", 9, 900, 20)
        .await
        .unwrap());
    assert!(!s
        .finish_ft_job(&old.id, "w1", FtStatus::Succeeded, Some("ft:x"), &[], None)
        .await
        .unwrap());
    assert!(s
        .update_ft_progress(&old.id, "w3", 2, 200, 20)
        .await
        .unwrap());
    let now = s.ft_job_by_id(&old.id).await.unwrap();
    assert_eq!((now.status, now.trained_steps), (FtStatus::Running, 2));
    assert_eq!(now.claimed_by.as_deref(), Some("w3"));
}

async fn claims_skip_running_and_unserved_jobs(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    // A node that does not serve the job's model never takes it.
    let other_model = vec!["some/other-model".to_string()];
    let rules = ClaimRules {
        models: Some(&other_model),
        ..ClaimRules::new("w1", 60)
    };
    assert_eq!(s.claim_ft_job(&rules).await.unwrap(), None);
    let none: Vec<String> = Vec::new();
    let rules = ClaimRules {
        models: Some(&none),
        ..ClaimRules::new("w1", 60)
    };
    assert_eq!(s.claim_ft_job(&rules).await.unwrap(), None);
    let served = vec![job.model.clone()];
    let rules = ClaimRules {
        models: Some(&served),
        ..ClaimRules::new("w1", 60)
    };
    let claimed = s.claim_ft_job(&rules).await.unwrap().unwrap();
    assert_eq!(
        (claimed.id.as_str(), claimed.attempts),
        (job.id.as_str(), 1)
    );
    // While w1 runs it, w1 does not claim it a second time (with more
    // slots free), and nobody else does either.
    let running = vec![job.id.clone()];
    let rules = ClaimRules {
        models: Some(&served),
        running_here: &running,
        ..ClaimRules::new("w1", 60)
    };
    for _ in 0..3 {
        assert_eq!(s.claim_ft_job(&rules).await.unwrap(), None);
        assert_eq!(
            s.claim_ft_job(&ClaimRules::new("w2", 60)).await.unwrap(),
            None
        );
    }
    assert_eq!(s.ft_job_by_id(&job.id).await.unwrap().attempts, 1);
    // A shutdown in good order gives it back, the attempt not counted; only
    // its holder can.
    assert!(!s.release_ft_job(&job.id, "w2").await.unwrap());
    assert!(s.release_ft_job(&job.id, "w1").await.unwrap());
    let back = s.ft_job_by_id(&job.id).await.unwrap();
    assert_eq!(
        (back.status, back.attempts, back.claimed_by),
        (FtStatus::Queued, 0, None)
    );
    assert!(!s
        .update_ft_progress(&job.id, "w1", 3, 30, 10)
        .await
        .unwrap());
    let again = s
        .claim_ft_job(&ClaimRules::new("w2", 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.id, again.attempts), (job.id.clone(), 1));
}

async fn attempts_are_bounded(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    // Claimed, then its worker dies each time (a restart takes it back).
    for attempt in 1..=3 {
        let claimed = s
            .claim_ft_job(&ClaimRules::new("w1", 60))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (claimed.id.as_str(), claimed.attempts),
            (job.id.as_str(), attempt)
        );
    }
    // A fourth claim fails it instead, with a clear error and event.
    let next = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let claimed = s
        .claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, next.id, "the next job is taken instead");
    let failed = s.ft_job_by_id(&job.id).await.unwrap();
    assert_eq!(failed.status, FtStatus::Failed);
    assert!(failed.finished_at.is_some());
    let error = failed.error.unwrap();
    assert_eq!(error["code"], "too_many_attempts", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("3 times"),
        "{error}"
    );
    let (events, _) = s.list_ft_events(&job.id, 10, None).await.unwrap();
    assert_eq!(events[0].level, "error");
    assert!(events[0].message.contains("not trying again"), "{events:?}");
    // A lower bound applies the same way.
    let strict = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    s.cancel_ft_job(&p, &next.id).await.unwrap();
    let rules = ClaimRules {
        max_attempts: 1,
        ..ClaimRules::new("w2", 60)
    };
    assert_eq!(s.claim_ft_job(&rules).await.unwrap().unwrap().id, strict.id);
    assert_eq!(s.claim_ft_job(&rules).await.unwrap(), None);
    assert_eq!(
        s.ft_job_by_id(&strict.id).await.unwrap().status,
        FtStatus::Failed
    );
}

async fn cancelled_jobs_stop_their_worker(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let claimed = s
        .claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, job.id);
    assert!(s.heartbeat_ft_job(&job.id, "w1").await.unwrap());
    assert!(!s.heartbeat_ft_job(&job.id, "w2").await.unwrap());
    let cancelled = s.cancel_ft_job(&p, &job.id).await.unwrap();
    assert_eq!(cancelled.status, FtStatus::Cancelled);
    assert!(!s.heartbeat_ft_job(&job.id, "w1").await.unwrap());
    // Neither progress nor finishing changes a cancelled job.
    assert!(!s
        .update_ft_progress(&job.id, "w1", 5, 1000, 30)
        .await
        .unwrap());
    assert!(!s
        .finish_ft_job(
            &job.id,
            "w1",
            FtStatus::Succeeded,
            Some("ft:x"),
            &["file-r".into()],
            None
        )
        .await
        .unwrap());
    let after = s.ft_job(&p, &job.id).await.unwrap();
    assert_eq!(after.status, FtStatus::Cancelled);
    assert_eq!(after.fine_tuned_model, None);
    assert_eq!(after.finished_at, cancelled.finished_at);
    assert_eq!(
        (after.trained_steps, after.trained_tokens, after.total_steps),
        (0, None, None)
    );
    // Nor is it claimed again.
    assert_eq!(
        s.claim_ft_job(&ClaimRules::new("w1", 0)).await.unwrap(),
        None
    );
}

async fn finish_records_results(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    // Not running yet: finishing does not apply.
    assert!(!s
        .finish_ft_job(&job.id, "w1", FtStatus::Failed, None, &[], None)
        .await
        .unwrap());
    assert!(matches!(
        s.finish_ft_job(&job.id, "w1", FtStatus::Running, None, &[], None)
            .await,
        Err(StoreError::Invalid(_))
    ));
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    let results = vec!["file-results".to_string()];
    assert!(s
        .finish_ft_job(
            &job.id,
            "w1",
            FtStatus::Succeeded,
            Some("ft:smol:mine:1"),
            &results,
            None
        )
        .await
        .unwrap());
    let done = s.ft_job(&p, &job.id).await.unwrap();
    assert_eq!(done.status, FtStatus::Succeeded);
    assert_eq!(done.fine_tuned_model.as_deref(), Some("ft:smol:mine:1"));
    assert_eq!(done.result_files, results);
    assert!(done.finished_at.is_some());
    // Finished once: never again.
    assert!(!s
        .finish_ft_job(&job.id, "w1", FtStatus::Failed, None, &[], None)
        .await
        .unwrap());
    assert!(!s.heartbeat_ft_job(&job.id, "w1").await.unwrap());
    // Found by its model, in its project only; listed as succeeded.
    assert_eq!(
        s.ft_job_by_model(&p, "ft:smol:mine:1").await.unwrap(),
        Some(done.clone())
    );
    let other = s.create_project("Other").await.unwrap().id;
    assert_eq!(
        s.ft_job_by_model(&other, "ft:smol:mine:1").await.unwrap(),
        None
    );
    assert_eq!(s.ft_job_by_model(&p, "ft:nope").await.unwrap(), None);
    assert_eq!(s.succeeded_ft_jobs(&p).await.unwrap(), vec![done]);
    assert!(s.succeeded_ft_jobs(&other).await.unwrap().is_empty());

    // A failure keeps its error.
    let bad = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    let error =
        json!({"code": "invalid_training_file", "message": "too short", "param": "training_file"});
    assert!(s
        .finish_ft_job(
            &bad.id,
            "w1",
            FtStatus::Failed,
            None,
            &[],
            Some(error.clone())
        )
        .await
        .unwrap());
    let failed = s.ft_job_by_id(&bad.id).await.unwrap();
    assert_eq!(
        (failed.status, failed.error),
        (FtStatus::Failed, Some(error))
    );
    assert_eq!(s.succeeded_ft_jobs(&p).await.unwrap().len(), 1);
}

async fn events_and_checkpoints_page_newest_first(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let other = s.create_ft_job(new_job(&p, "file-a")).await.unwrap();
    let mut events = Vec::new();
    for step in 1..=4 {
        events.push(
            s.add_ft_event(
                &job.id,
                "info",
                "metrics",
                &format!("Step {step}/4"),
                Some(json!({"step": step, "train_loss": 1.0 / step as f64})),
            )
            .await
            .unwrap(),
        );
    }
    let (page1, more) = s.list_ft_events(&job.id, 3, None).await.unwrap();
    assert!(more);
    assert_eq!(
        page1.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        vec!["Step 4/4", "Step 3/4", "Step 2/4"]
    );
    assert_eq!(page1[0], events[3]);
    assert_eq!(page1[0].data.as_ref().unwrap()["step"], 4);
    let (page2, more) = s
        .list_ft_events(&job.id, 3, Some(&page1[2].id))
        .await
        .unwrap();
    assert!(!more);
    assert_eq!(
        page2.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        vec!["Step 1/4", "Created fine-tuning job"]
    );
    assert_eq!(page2[1].data, None);
    assert_eq!(
        s.list_ft_events(&other.id, 10, None).await.unwrap().0.len(),
        1
    );

    assert_eq!(s.latest_ft_checkpoint(&job.id).await.unwrap(), None);
    let prefix = hearth_store::ft_blob_prefix(&job.id);
    let mut ckpts = Vec::new();
    for step in [10, 30, 20] {
        ckpts.push(
            s.add_ft_checkpoint(
                &job.id,
                step,
                &format!("ft:smol:mine:ckpt-step-{step}"),
                json!({"step": step, "train_loss": 0.5}),
                &format!("{prefix}/step-{step}"),
            )
            .await
            .unwrap(),
        );
    }
    assert!(ckpts[0].id.starts_with("ftckpt-"));
    let (page1, more) = s.list_ft_checkpoints(&job.id, 2, None).await.unwrap();
    assert!(more);
    assert_eq!(page1, vec![ckpts[2].clone(), ckpts[1].clone()]);
    let (page2, more) = s
        .list_ft_checkpoints(&job.id, 2, Some(&page1[1].id))
        .await
        .unwrap();
    assert!(!more);
    assert_eq!(page2, vec![ckpts[0].clone()]);
    assert_eq!(
        s.latest_ft_checkpoint(&job.id).await.unwrap(),
        Some(ckpts[1].clone()),
        "the highest step, not the newest row"
    );
    assert_eq!(
        s.ft_checkpoint(&job.id, &ckpts[0].id).await.unwrap(),
        ckpts[0]
    );
    assert!(matches!(
        s.ft_checkpoint(&other.id, &ckpts[0].id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s
        .list_ft_checkpoints(&other.id, 10, None)
        .await
        .unwrap()
        .0
        .is_empty());
}

async fn sweep_keeps_fine_tuning_blobs(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let kept = s
        .create_file_from_bytes(&p, "kept.txt", "user_data", b"kept")
        .await
        .unwrap();
    // An orphan file blob (no row) goes; checkpoint blobs stay.
    s.blobs().put("files/file-orphan", b"lost").await.unwrap();
    let job = "ftjob-01J00000000000000000000000";
    let key = format!(
        "{}/step-10/adapter.safetensors",
        hearth_store::ft_blob_prefix(job)
    );
    s.blobs().put(&key, b"weights").await.unwrap();
    s.blobs()
        .put(
            &format!("fine_tuning/{job}/step-10/adapter_config.json"),
            b"{}",
        )
        .await
        .unwrap();
    assert_eq!(
        s.sweep_orphan_blobs(std::time::Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    assert_eq!(s.blobs().file_ids().await.unwrap(), vec![kept.id.clone()]);
    assert_eq!(s.blobs().get(&key).await.unwrap(), b"weights");
    let mut keys = s.blobs().keys("fine_tuning").await.unwrap();
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    // A job's prefix goes as a whole, and only that job's.
    let other_key = "fine_tuning/ftjob-01J000000000000000000000009/a";
    s.blobs().put(other_key, b"x").await.unwrap();
    s.blobs()
        .delete_prefix(&hearth_store::ft_blob_prefix(job))
        .await
        .unwrap();
    assert_eq!(
        s.blobs().keys("fine_tuning").await.unwrap(),
        vec![other_key.to_string()]
    );
    assert!(matches!(
        s.blobs().get(&key).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn files_of_active_jobs_cannot_be_deleted(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let train = s
        .create_file_from_bytes(&p, "train.jsonl", "fine-tune", b"{}\n")
        .await
        .unwrap();
    let valid = s
        .create_file_from_bytes(&p, "valid.jsonl", "fine-tune", b"{}\n")
        .await
        .unwrap();
    assert!(s.file_users(&train.id).await.unwrap().is_empty());
    let mut new = new_job(&p, &train.id);
    new.validation_file = Some(valid.id.clone());
    let job = s.create_ft_job(new).await.unwrap();
    assert_eq!(s.file_users(&train.id).await.unwrap(), vec![job.id.clone()]);
    assert_eq!(s.file_users(&valid.id).await.unwrap(), vec![job.id.clone()]);
    for id in [&train.id, &valid.id] {
        match s.delete_file(&p, id).await {
            Err(StoreError::InUse(message)) => assert!(message.contains(&job.id), "{message}"),
            other => panic!("expected InUse, got {other:?}"),
        }
    }
    // Running: still in use.
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        s.delete_file(&p, &train.id).await,
        Err(StoreError::InUse(_))
    ));
    // Once the job is over, the files may go.
    s.cancel_ft_job(&p, &job.id).await.unwrap();
    assert!(s.file_users(&train.id).await.unwrap().is_empty());
    s.delete_file(&p, &train.id).await.unwrap();
    s.delete_file(&p, &valid.id).await.unwrap();
    assert!(s.blobs().file_ids().await.unwrap().is_empty());
}

async fn server_written_files(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let csv = b"step,train_loss\n1,2.5\n";
    let f = s
        .create_file_from_bytes(&p, "step_metrics.csv", "fine-tune-results", csv)
        .await
        .unwrap();
    assert!(hearth_store::files::is_well_formed(&f.id));
    assert_eq!(
        (f.bytes, f.status.as_str()),
        (csv.len() as i64, "processed")
    );
    assert_eq!(s.file(&p, &f.id).await.unwrap(), f);
    assert_eq!(
        s.blobs().get(&format!("files/{}", f.id)).await.unwrap(),
        csv
    );
    // A row that cannot be written (unknown project) leaves no blob.
    assert!(s
        .create_file_from_bytes("project-missing", "x.csv", "fine-tune-results", b"x")
        .await
        .is_err());
    assert_eq!(s.blobs().file_ids().await.unwrap(), vec![f.id]);
}
