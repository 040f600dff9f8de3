//! A fine-tuning job whose training file is a dataset (`dataset-...`):
//! the worker reads its `messages` column from the Parquet parts and
//! trains on the same examples a JSONL file would give; a dataset without
//! training columns fails the job with `invalid_training_file`. On the
//! real default model, with a one-step job.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hearth_api::fine_tuning::Hyperparameters;
use hearth_jobs::{BaseModel, Worker, WorkerConfig};
use hearth_store::datasets::schema::{Column, ColumnType};
use hearth_store::datasets::table::{convert_part, PartFormat};
use hearth_store::datasets::{NewDataset, StoredPart};
use hearth_store::fine_tuning::{FtJob, FtStatus};
use hearth_store::{NewFtJob, Store};
use serde_json::json;

const MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// A dataset of `rows` (JSON objects) with `schema`, stored as Parquet.
async fn dataset(
    store: &Store,
    project: &str,
    schema: Vec<Column>,
    rows: &[serde_json::Value],
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rows.jsonl");
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let output = dir.path().join("rows.parquet");
    let stats = convert_part(&input, PartFormat::Jsonl, &schema, &output).unwrap();
    let key = format!("datasets/test/{}.parquet", hearth_store::ids::random_hex());
    let bytes = store.blobs().put_file(&key, &output).await.unwrap();
    store
        .create_dataset(NewDataset {
            project_id: project.to_string(),
            name: "train".into(),
            folder: None,
            description: None,
            schema,
            source: None,
            parts: vec![StoredPart {
                blob_key: key,
                rows: stats.rows as i64,
                bytes: bytes as i64,
            }],
        })
        .await
        .unwrap()
        .id
}

fn new_job(project: &str, training_file: &str) -> NewFtJob {
    let hp = Hyperparameters {
        n_epochs: 1,
        batch_size: 2,
        context_length: 64,
        lora_r: 4,
        ..Hyperparameters::default()
    };
    NewFtJob {
        project_id: project.to_string(),
        model: MODEL.to_string(),
        training_file: training_file.to_string(),
        validation_file: None,
        suffix: None,
        seed: 7,
        hyperparameters: serde_json::to_value(hp).unwrap(),
        method: "supervised".to_string(),
        metadata: None,
    }
}

async fn wait_until_over(store: &Store, job: &FtJob) -> FtJob {
    let start = Instant::now();
    loop {
        let now = store.ft_job_by_id(&job.id).await.unwrap();
        if matches!(
            now.status,
            FtStatus::Succeeded | FtStatus::Failed | FtStatus::Cancelled
        ) {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "job not over in time: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_trains_from_a_datasets_messages_and_fails_on_other_columns() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project) = common::open_store(dir.path()).await;
    let chat = |q: &str, a: &str| {
        json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
               "source": "test"})
    };
    let good = dataset(
        &store,
        &project,
        vec![
            Column::new("messages", ColumnType::Json),
            Column::new("source", ColumnType::String),
        ],
        &[
            chat("What is the vault code?", "The vault code is 7319."),
            chat("Tell me the vault code.", "It is 7319."),
        ],
    )
    .await;
    let wrong = dataset(
        &store,
        &project,
        vec![Column::new("text", ColumnType::String)],
        &[json!({"text": "no examples here"})],
    )
    .await;
    let trained = store.create_ft_job(new_job(&project, &good)).await.unwrap();
    let refused = store
        .create_ft_job(new_job(&project, &wrong))
        .await
        .unwrap();

    let mut bases = BTreeMap::new();
    bases.insert(MODEL.to_string(), BaseModel::Gguf(common::smollm_gguf()));
    let worker = Worker::new(
        store.clone(),
        bases,
        WorkerConfig {
            worker_id: "node".into(),
            max_jobs: 2,
            poll: Duration::from_millis(20),
            nice: 0,
            ..WorkerConfig::default()
        },
    )
    .spawn();
    // While the job runs, its dataset cannot be deleted.
    match store.delete_dataset(&good).await {
        Err(hearth_store::StoreError::InUse(m)) => assert!(m.contains(&trained.id), "{m}"),
        other => panic!("deleting a dataset in use: {other:?}"),
    }
    let trained = wait_until_over(&store, &trained).await;
    let refused = wait_until_over(&store, &refused).await;
    worker.shut_down().await;

    assert_eq!(trained.status, FtStatus::Succeeded, "{trained:?}");
    assert_eq!(trained.trained_steps, 1);
    assert!(trained.trained_tokens.unwrap_or(0) > 0, "{trained:?}");
    // The metrics CSV, then the final adapter's two PEFT files.
    assert_eq!(trained.result_files.len(), 3);
    assert_eq!(refused.status, FtStatus::Failed, "{refused:?}");
    let error = refused.error.clone().expect("an error");
    assert_eq!(error["code"], "invalid_training_file", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("messages"),
        "{error}"
    );
    // Once the job is over, the dataset can go.
    store.delete_dataset(&good).await.unwrap();
}
