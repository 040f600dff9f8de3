//! Two workers over one store (two nodes sharing a database): every job is
//! trained by exactly one of them, once, and a node never takes a job for a
//! model it does not serve; a shutdown in good order gives a job back and
//! another node resumes it. On the real default model, with small jobs.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hearth_api::fine_tuning::Hyperparameters;
use hearth_jobs::{BaseModel, Worker, WorkerConfig};
use hearth_store::fine_tuning::{FtJob, FtStatus};
use hearth_store::{FileRecord, NewFtJob, Store};

const MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

fn dataset() -> String {
    let line = |q: &str, a: &str| {
        serde_json::json!({"messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": a},
        ]})
        .to_string()
    };
    [
        line("What is the vault code?", "The vault code is 7319."),
        line("Tell me the vault code.", "It is 7319."),
    ]
    .join("\n")
}

fn new_job(project: &str, file: &str, model: &str) -> NewFtJob {
    let hp = Hyperparameters {
        n_epochs: 1,
        batch_size: 2,
        context_length: 64,
        lora_r: 4,
        ..Hyperparameters::default()
    };
    NewFtJob {
        project_id: project.to_string(),
        model: model.to_string(),
        training_file: file.to_string(),
        validation_file: None,
        suffix: None,
        seed: 7,
        hyperparameters: serde_json::to_value(hp).unwrap(),
        method: "supervised".to_string(),
        metadata: None,
    }
}

fn worker(store: &Store, name: &str) -> Worker {
    let mut bases = BTreeMap::new();
    bases.insert(MODEL.to_string(), BaseModel::Gguf(common::smollm_gguf()));
    Worker::new(
        store.clone(),
        bases,
        WorkerConfig {
            worker_id: name.to_string(),
            max_jobs: 2,
            poll: Duration::from_millis(20),
            nice: 0,
            ..WorkerConfig::default()
        },
    )
}

/// A fresh store in `dir`, its default project, and a training file there.
async fn store_with_dataset(dir: &std::path::Path) -> (Store, String, FileRecord) {
    let (store, project) = common::open_store(dir).await;
    let file = store
        .create_file_from_bytes(&project, "train.jsonl", "fine-tune", dataset().as_bytes())
        .await
        .unwrap();
    (store, project, file)
}

async fn events(store: &Store, job: &FtJob) -> Vec<String> {
    let (page, more) = store.list_ft_events(&job.id, 100, None).await.unwrap();
    assert!(!more);
    page.into_iter().map(|e| e.message).collect()
}

/// A job of many short steps: the 2 examples, batch 1, `epochs` epochs
/// (two steps each).
async fn stepwise_job(store: &Store, project: &str, file: &str, epochs: i64) -> FtJob {
    let mut new = new_job(project, file, MODEL);
    new.hyperparameters["batch_size"] = 1.into();
    new.hyperparameters["n_epochs"] = epochs.into();
    store.create_ft_job(new).await.unwrap()
}

/// Waits until `job` has trained `steps` steps.
async fn until_trained(store: &Store, job: &FtJob, steps: i64) {
    let start = Instant::now();
    while store.ft_job_by_id(&job.id).await.unwrap().trained_steps < steps {
        assert!(start.elapsed() < Duration::from_secs(600), "no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_never_run_the_same_job() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project, file) = store_with_dataset(dir.path()).await;
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(
            store
                .create_ft_job(new_job(&project, &file.id, MODEL))
                .await
                .unwrap(),
        );
    }
    // A job for a model neither node serves stays queued.
    let foreign = store
        .create_ft_job(new_job(&project, &file.id, "some/unserved-model"))
        .await
        .unwrap();
    let a = worker(&store, "node-a").spawn();
    let b = worker(&store, "node-b").spawn();

    let start = Instant::now();
    loop {
        let mut done = 0;
        for job in &jobs {
            let now = store.ft_job_by_id(&job.id).await.unwrap();
            assert!(
                !matches!(now.status, FtStatus::Failed | FtStatus::Cancelled),
                "{now:?}: {:?}",
                events(&store, job).await
            );
            done += usize::from(now.status == FtStatus::Succeeded);
        }
        if done == jobs.len() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "jobs not done in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.shut_down().await;
    b.shut_down().await;

    for job in &jobs {
        let now = store.ft_job_by_id(&job.id).await.unwrap();
        let messages = events(&store, job).await;
        // One claim, one start, one metrics step, one completion.
        assert_eq!(now.attempts, 1, "{now:?} {messages:?}");
        assert!(
            matches!(now.claimed_by.as_deref(), Some("node-a" | "node-b")),
            "{now:?}"
        );
        let count = |prefix: &str| messages.iter().filter(|m| m.starts_with(prefix)).count();
        assert_eq!(count("Training started"), 1, "{messages:?}");
        assert_eq!(count("Step 1/1"), 1, "{messages:?}");
        assert_eq!(
            count("The job has successfully completed"),
            1,
            "{messages:?}"
        );
        assert_eq!(count("Resumed") + count("Restarted"), 0, "{messages:?}");
        assert_eq!(now.trained_steps, 1);
        // The metrics CSV, then the final adapter's two PEFT files.
        assert_eq!(now.result_files.len(), 3);
    }
    let foreign = store.ft_job_by_id(&foreign.id).await.unwrap();
    assert_eq!(
        (foreign.status, foreign.attempts, foreign.claimed_by),
        (FtStatus::Queued, 0, None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shutdown_gives_the_job_back_and_another_node_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project, file) = store_with_dataset(dir.path()).await;
    // 20 steps.
    let job = stepwise_job(&store, &project, &file.id, 10).await;

    let a = worker(&store, "node-a").spawn();
    until_trained(&store, &job, 3).await;
    a.shut_down().await;
    let paused = store.ft_job_by_id(&job.id).await.unwrap();
    assert_eq!(
        (paused.status, paused.attempts, paused.claimed_by.as_deref()),
        (FtStatus::Queued, 0, None),
        "{:?}",
        events(&store, &job).await
    );

    let b = worker(&store, "node-b").spawn();
    let start = Instant::now();
    loop {
        let now = store.ft_job_by_id(&job.id).await.unwrap();
        assert!(
            matches!(
                now.status,
                FtStatus::Queued | FtStatus::Running | FtStatus::Succeeded
            ),
            "{now:?}"
        );
        if now.status == FtStatus::Succeeded {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "not done in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.shut_down().await;
    let done = store.ft_job_by_id(&job.id).await.unwrap();
    let messages = events(&store, &job).await;
    assert_eq!(
        done.attempts, 1,
        "the shutdown is not an attempt: {messages:?}"
    );
    assert_eq!(done.claimed_by.as_deref(), Some("node-b"));
    assert_eq!(done.trained_steps, 20);
    let count = |prefix: &str| messages.iter().filter(|m| m.starts_with(prefix)).count();
    assert_eq!(count("Paused: the server shut down"), 1, "{messages:?}");
    assert_eq!(count("Training started"), 1, "{messages:?}");
    assert_eq!(
        count("Resumed training from checkpoint at step"),
        1,
        "{messages:?}"
    );
    for step in 1..=20 {
        let prefix = format!("Step {step}/20:");
        assert_eq!(count(&prefix), 1, "step {step}: {messages:?}");
    }
}

/// A shutdown in good order stops the training thread before it returns:
/// once `shut_down` has returned, no training thread is left to reach for
/// the store through a runtime that is going away (one did, and panicked
/// with "A Tokio 1.x context was found, but it is being shutdown"). The
/// probe: "serving is busy" parks the training thread between steps,
/// where it asks again every 50 ms (for up to 5 s); after `shut_down`
/// nobody may ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shutdown_stops_the_training_thread_before_it_returns() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (store, project, file) = store_with_dataset(dir.path()).await;
    // 100 steps, far more than it runs.
    let job = stepwise_job(&store, &project, &file.id, 50).await;
    let (busy, asked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let probe = {
        let (busy, asked) = (busy.clone(), asked.clone());
        Arc::new(move || {
            asked.fetch_add(1, Ordering::SeqCst);
            busy.load(Ordering::SeqCst)
        })
    };
    let mut bases = BTreeMap::new();
    bases.insert(MODEL.to_string(), BaseModel::Gguf(common::smollm_gguf()));
    let config = WorkerConfig {
        worker_id: "node-a".to_string(),
        max_jobs: 1,
        poll: Duration::from_millis(20),
        nice: 0,
        serving_busy: Some(probe),
        yield_max: Duration::from_secs(5),
        ..WorkerConfig::default()
    };
    let a = Worker::new(store.clone(), bases, config).spawn();
    until_trained(&store, &job, 2).await;
    // Parked between steps: it keeps asking.
    busy.store(true, Ordering::SeqCst);
    let before = asked.load(Ordering::SeqCst);
    let start = Instant::now();
    while asked.load(Ordering::SeqCst) < before + 3 {
        assert!(start.elapsed() < Duration::from_secs(60), "never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.shut_down().await;
    let after = asked.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        after,
        "the training thread still runs after the shutdown"
    );
    let paused = store.ft_job_by_id(&job.id).await.unwrap();
    assert_eq!((paused.status, paused.claimed_by), (FtStatus::Queued, None));
}

/// A cancel stops the training at the step after it (the heartbeat alone
/// noticed it up to 10 s later, after several steps and a checkpoint), and
/// the job is left as the cancel found it: the step running at the cancel
/// records neither its progress, its event nor a checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_stops_the_training_at_the_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project, file) = store_with_dataset(dir.path()).await;
    // 100 steps.
    let job = stepwise_job(&store, &project, &file.id, 50).await;
    let a = worker(&store, "node-a").spawn();
    until_trained(&store, &job, 2).await;
    let cancelled = store.cancel_ft_job(&project, &job.id).await.unwrap();
    assert_eq!(cancelled.status, FtStatus::Cancelled);
    let checkpoints = store
        .list_ft_checkpoints(&job.id, 100, None)
        .await
        .unwrap()
        .0;
    let events = store.list_ft_events(&job.id, 1000, None).await.unwrap().0;
    // Several steps' time here (a debug build's step takes about a
    // second), well before the heartbeat's next beat (10 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = store.ft_job_by_id(&job.id).await.unwrap();
    assert_eq!(now, cancelled, "the job changed after its cancel");
    let (later, _) = store.list_ft_checkpoints(&job.id, 100, None).await.unwrap();
    assert_eq!(later, checkpoints);
    let (later, _) = store.list_ft_events(&job.id, 1000, None).await.unwrap();
    assert_eq!(later, events);
    a.shut_down().await;
}
