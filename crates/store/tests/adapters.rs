//! Adapters out and in, in the store: a checkpoint's published files commit
//! with its row, a job's success with its metrics CSV (and nothing is
//! published when the success does not apply); imported adapters are
//! named, scoped to their project, unique by name and deleted with their
//! files. Each runs on SQLite, and on PostgreSQL when
//! `HEARTH_TEST_DATABASE_URL` names a server.

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::adapters::{adapter_blob_prefix, is_well_formed_adapter_id};
use hearth_store::fine_tuning::RESULTS_PURPOSE;
use hearth_store::{
    ClaimRules, FtStatus, ListOrder, NewAdapter, NewCheckpoint, NewFtJob, ResultFile, StoreError,
};
use serde_json::json;

on_both!(
    checkpoint_files_commit_with_the_checkpoint,
    success_publishes_the_csv_once,
    imported_adapters_are_scoped_unique_and_deleted,
);

fn new_job(project: &str) -> NewFtJob {
    NewFtJob {
        project_id: project.to_string(),
        model: "HuggingFaceTB/SmolLM2-135M-Instruct".to_string(),
        training_file: "file-a".to_string(),
        validation_file: None,
        suffix: None,
        seed: 1,
        hyperparameters: json!({}),
        method: "supervised".to_string(),
        metadata: None,
    }
}

const PEFT: [ResultFile<'static>; 2] = [
    ResultFile {
        filename: "adapter_model.safetensors",
        bytes: b"weights",
    },
    ResultFile {
        filename: "adapter_config.json",
        bytes: b"{\"r\": 4}",
    },
];

async fn result_files(env: &Env, project: &str) -> Vec<String> {
    let (files, _) = env
        .store
        .list_files(project, Some(RESULTS_PURPOSE), None, 100, ListOrder::Asc)
        .await
        .unwrap();
    files.into_iter().map(|f| f.id).collect()
}

async fn checkpoint_files_commit_with_the_checkpoint(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p)).await.unwrap();
    let ckpt = s
        .add_ft_checkpoint_with_files(NewCheckpoint {
            job_id: &job.id,
            project_id: &p,
            step_number: 2,
            fine_tuned_model_checkpoint: "m:ckpt-step-2",
            metrics: json!({"step": 2}),
            blob_prefix: "x",
            files: &PEFT,
        })
        .await
        .unwrap();
    assert_eq!(ckpt.result_files.len(), 2);
    // Read back with its files, which are the project's, in order, with
    // their PEFT names and bytes.
    assert_eq!(
        s.latest_ft_checkpoint(&job.id).await.unwrap(),
        Some(ckpt.clone())
    );
    for (id, f) in ckpt.result_files.iter().zip(PEFT) {
        let file = s.file(&p, id).await.unwrap();
        assert_eq!(
            (
                file.filename.as_str(),
                file.purpose.as_str(),
                file.status.as_str()
            ),
            (f.filename, RESULTS_PURPOSE, "processed")
        );
        assert_eq!(file.bytes, f.bytes.len() as i64);
        assert_eq!(
            s.blobs().get(&format!("files/{id}")).await.unwrap(),
            f.bytes
        );
    }
    assert_eq!(result_files(&env, &p).await, ckpt.result_files);
    // A checkpoint without files lists none.
    let bare = s
        .add_ft_checkpoint(&job.id, 3, "m:ckpt-step-3", json!({}), "y")
        .await
        .unwrap();
    assert!(bare.result_files.is_empty());
    assert_eq!(s.ft_checkpoint(&job.id, &bare.id).await.unwrap(), bare);
    // A checkpoint row that cannot commit (an unknown job) leaves neither
    // file rows nor blobs behind.
    let before = s.blobs().file_ids().await.unwrap();
    assert!(s
        .add_ft_checkpoint_with_files(NewCheckpoint {
            job_id: "ftjob-missing",
            project_id: &p,
            step_number: 1,
            fine_tuned_model_checkpoint: "m",
            metrics: json!({}),
            blob_prefix: "z",
            files: &PEFT,
        })
        .await
        .is_err());
    assert_eq!(result_files(&env, &p).await, ckpt.result_files);
    assert_eq!(s.blobs().file_ids().await.unwrap(), before);
}

async fn success_publishes_the_csv_once(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let job = s.create_ft_job(new_job(&p)).await.unwrap();
    let csv = [ResultFile {
        filename: "step_metrics.csv",
        bytes: b"step,train_loss\n1,2\n",
    }];
    let adapter = vec!["file-w".to_string(), "file-c".to_string()];
    // Not running under this worker: nothing applies, nothing is published.
    assert!(!s
        .succeed_ft_job_with_files(&job.id, "w1", "m:ftjob", &csv, &adapter)
        .await
        .unwrap());
    assert!(result_files(&env, &p).await.is_empty());
    assert!(s.blobs().file_ids().await.unwrap().is_empty());
    s.claim_ft_job(&ClaimRules::new("w1", 60))
        .await
        .unwrap()
        .unwrap();
    assert!(!s
        .succeed_ft_job_with_files(&job.id, "w2", "m:ftjob", &csv, &adapter)
        .await
        .unwrap());
    assert!(s
        .succeed_ft_job_with_files(&job.id, "w1", "m:ftjob", &csv, &adapter)
        .await
        .unwrap());
    let done = s.ft_job(&p, &job.id).await.unwrap();
    assert_eq!(done.status, FtStatus::Succeeded);
    assert_eq!(done.fine_tuned_model.as_deref(), Some("m:ftjob"));
    let published = result_files(&env, &p).await;
    assert_eq!(published.len(), 1);
    assert_eq!(done.result_files[0], published[0]);
    assert_eq!(&done.result_files[1..], &adapter[..]);
    // Once: a second success does not apply and publishes nothing more.
    assert!(!s
        .succeed_ft_job_with_files(&job.id, "w1", "m:ftjob", &csv, &adapter)
        .await
        .unwrap());
    assert_eq!(result_files(&env, &p).await, published);
    assert_eq!(s.blobs().file_ids().await.unwrap(), published);
}

async fn imported_adapters_are_scoped_unique_and_deleted(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    let make = |project: String, name: &'static str| async move {
        s.create_adapter(NewAdapter {
            project_id: &project,
            name,
            base_model: "org/base",
            details: json!({"r": 4}),
            files: &PEFT,
        })
        .await
    };
    let a = make(p.clone(), "support-v1").await.unwrap();
    assert!(is_well_formed_adapter_id(&a.id), "{}", a.id);
    assert_eq!(a.model, format!("org/base:support-v1:{}", a.id));
    assert_eq!(a.details["r"], 4);
    for f in PEFT {
        let key = format!("{}/{}", adapter_blob_prefix(&a.id), f.filename);
        assert_eq!(s.blobs().get(&key).await.unwrap(), f.bytes);
    }
    // Scoped: another project neither sees it nor is barred from the name.
    assert_eq!(s.adapter(&p, &a.id).await.unwrap(), a);
    assert!(matches!(
        s.adapter(&other, &a.id).await,
        Err(StoreError::NotFound(_))
    ));
    let b = make(other.clone(), "support-v1").await.unwrap();
    assert_eq!(s.list_adapters(Some(&p)).await.unwrap(), vec![a.clone()]);
    assert_eq!(
        s.list_adapters(None).await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    // Refused: a taken name, a bad name, an unknown project.
    for (project, name) in [
        (p.clone(), "support-v1"),
        (p.clone(), "has space"),
        (p.clone(), ""),
        ("project-missing".to_string(), "fine"),
    ] {
        match make(project, name).await {
            Err(StoreError::Invalid(message)) => assert!(!message.is_empty()),
            other => panic!("{name}: expected Invalid, got {other:?}"),
        }
    }
    assert_eq!(s.list_adapters(None).await.unwrap().len(), 2);
    // The orphan sweep keeps adapters' files.
    s.sweep_orphan_blobs(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(s.blobs().keys("adapters").await.unwrap().len(), 4);
    // Deleted with its files; the name is free again.
    assert_eq!(s.delete_adapter(&a.id).await.unwrap(), a);
    assert!(matches!(
        s.delete_adapter(&a.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.blobs().keys("adapters").await.unwrap().len(), 2);
    assert_eq!(s.adapter_by_name(&p, "support-v1").await.unwrap(), None);
    make(p.clone(), "support-v1").await.unwrap();
}
