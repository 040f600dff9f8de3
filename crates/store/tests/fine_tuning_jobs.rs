//! Fine-tuning repository tests: the job list's metadata filter, the
//! worker's writes refused once a job is cancelled, and deleted fine-tuned
//! models. Each runs on SQLite, and on PostgreSQL when
//! `HEARTH_TEST_DATABASE_URL` names a server (a fresh database per test).

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::{ClaimRules, FtStatus, NewCheckpoint, NewFtJob, ResultFile};
use serde_json::{json, Value};

on_both!(
    jobs_filter_by_metadata_and_page,
    a_cancelled_job_takes_no_more_writes,
    deleted_models_are_gone_but_the_job_keeps_its_name,
);

fn new_job(project: &str, metadata: Option<Value>) -> NewFtJob {
    NewFtJob {
        project_id: project.to_string(),
        model: "HuggingFaceTB/SmolLM2-135M-Instruct".to_string(),
        training_file: "file-a".to_string(),
        validation_file: None,
        suffix: None,
        seed: 42,
        hyperparameters: json!({"n_epochs": 3, "learning_rate": 1e-4}),
        method: "supervised".to_string(),
        metadata,
    }
}

/// Checkpoint `step` of `job`, served as `name` (no metrics), its blobs
/// under `blob_prefix`.
fn checkpoint<'a>(
    job: &'a str,
    project: &'a str,
    (step, name): (i64, &'a str),
    blob_prefix: &'a str,
    files: &'a [ResultFile<'a>],
) -> NewCheckpoint<'a> {
    NewCheckpoint {
        job_id: job,
        project_id: project,
        step_number: step,
        fine_tuned_model_checkpoint: name,
        metrics: json!({}),
        blob_prefix,
        files,
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn jobs_filter_by_metadata_and_page(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let mut qa = Vec::new();
    for i in 0..5 {
        let m = json!({"who": "qa2", "n": i.to_string()});
        qa.push(s.create_ft_job(new_job(&p, Some(m))).await.unwrap().id);
        s.create_ft_job(new_job(&p, Some(json!({"who": "dev"}))))
            .await
            .unwrap();
        s.create_ft_job(new_job(&p, None)).await.unwrap();
    }
    s.create_ft_job(new_job(&other, Some(json!({"who": "qa2"}))))
        .await
        .unwrap();
    qa.reverse();
    let ids = |jobs: &[hearth_store::FtJob]| jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
    let who = pairs(&[("who", "qa2")]);
    let (all, more) = s
        .list_ft_jobs_with_metadata(&p, 20, None, &who)
        .await
        .unwrap();
    assert_eq!((ids(&all), more), (qa.clone(), false));
    // Pages of 2, newest first, `after` the last of each.
    let (page1, more) = s
        .list_ft_jobs_with_metadata(&p, 2, None, &who)
        .await
        .unwrap();
    assert_eq!((ids(&page1), more), (qa[..2].to_vec(), true));
    let (page2, more) = s
        .list_ft_jobs_with_metadata(&p, 2, Some(&qa[3]), &who)
        .await
        .unwrap();
    assert_eq!((ids(&page2), more), (qa[4..].to_vec(), false));
    // Every pair must match.
    let both = pairs(&[("who", "qa2"), ("n", "3")]);
    let (one, _) = s
        .list_ft_jobs_with_metadata(&p, 20, None, &both)
        .await
        .unwrap();
    assert_eq!(ids(&one), vec![qa[1].clone()]);
    let none = pairs(&[("who", "qa2"), ("n", "9")]);
    let (empty, more) = s
        .list_ft_jobs_with_metadata(&p, 20, None, &none)
        .await
        .unwrap();
    assert!(empty.is_empty() && !more);
    // No pairs: every job.
    let (every, _) = s
        .list_ft_jobs_with_metadata(&p, 100, None, &[])
        .await
        .unwrap();
    assert_eq!(every.len(), 15);
}

async fn a_cancelled_job_takes_no_more_writes(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, None)).await.unwrap();
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    // While it runs, the worker's writes apply.
    assert!(s
        .update_ft_progress(&job.id, "w1", 4, 400, 10)
        .await
        .unwrap());
    assert!(s
        .add_held_ft_event(&job.id, "w1", "info", "metrics", "Step 4/10", None)
        .await
        .unwrap());
    let files = [ResultFile {
        filename: "adapter_model.safetensors",
        bytes: b"w",
    }];
    let ckpt = s
        .add_held_ft_checkpoint_with_files(
            "w1",
            checkpoint(&job.id, &p, (4, "m:ckpt-step-4"), "x", &files),
        )
        .await
        .unwrap()
        .expect("written while running");
    // Another worker's are refused.
    assert!(!s
        .add_held_ft_event(&job.id, "w2", "info", "metrics", "Step 4/10", None)
        .await
        .unwrap());
    s.cancel_ft_job(&p, &job.id).await.unwrap();
    let (events_before, _) = s.list_ft_events(&job.id, 100, None).await.unwrap();
    let blobs_before = s.blobs().file_ids().await.unwrap();
    // Step 5 ends after the cancel: nothing of it is kept.
    assert!(!s
        .update_ft_progress(&job.id, "w1", 5, 500, 10)
        .await
        .unwrap());
    assert!(!s
        .add_held_ft_event(&job.id, "w1", "info", "metrics", "Step 5/10", None)
        .await
        .unwrap());
    assert_eq!(
        s.add_held_ft_checkpoint_with_files(
            "w1",
            checkpoint(&job.id, &p, (5, "m:ckpt-step-5"), "y", &files)
        )
        .await
        .unwrap(),
        None
    );
    let after = s.ft_job(&p, &job.id).await.unwrap();
    assert_eq!(after.status, FtStatus::Cancelled);
    assert_eq!(
        (after.trained_steps, after.trained_tokens, after.total_steps),
        (4, Some(400), Some(10))
    );
    assert_eq!(
        s.list_ft_events(&job.id, 100, None).await.unwrap().0,
        events_before
    );
    let (ckpts, _) = s.list_ft_checkpoints(&job.id, 100, None).await.unwrap();
    assert_eq!(ckpts, vec![ckpt]);
    assert_eq!(s.blobs().file_ids().await.unwrap(), blobs_before);
}

async fn deleted_models_are_gone_but_the_job_keeps_its_name(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let job = s.create_ft_job(new_job(&p, None)).await.unwrap();
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert!(s
        .finish_ft_job(&job.id, "w1", FtStatus::Succeeded, Some("m:ft"), &[], None)
        .await
        .unwrap());
    assert!(s.ft_job_by_model(&p, "m:ft").await.unwrap().is_some());
    // Not another project's, nor a name no job has.
    assert!(!s.delete_ft_model(&other, "m:ft").await.unwrap());
    assert!(!s.delete_ft_model(&p, "m:nope").await.unwrap());
    assert!(s.delete_ft_model(&p, "m:ft").await.unwrap());
    assert!(!s.delete_ft_model(&p, "m:ft").await.unwrap(), "only once");
    assert_eq!(s.ft_job_by_model(&p, "m:ft").await.unwrap(), None);
    assert!(s.succeeded_ft_jobs(&p).await.unwrap().is_empty());
    let kept = s.ft_job(&p, &job.id).await.unwrap();
    assert_eq!(
        (kept.status, kept.fine_tuned_model.as_deref()),
        (FtStatus::Succeeded, Some("m:ft"))
    );
}
