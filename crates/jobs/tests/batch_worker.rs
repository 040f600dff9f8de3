//! The batch worker over endpoints that answer at once (no model): a
//! cancel that lands after the last result, before the worker's heartbeat
//! sees it, still ends the batch `cancelled` with every result, in the
//! attempt that ran it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use hearth_jobs::batch::BoxFuture;
use hearth_jobs::{BatchEndpoints, BatchWorker, BatchWorkerConfig, EndpointReply};
use hearth_store::{BatchStatus, NewBatch, Store};
use serde_json::{json, Map, Value};

/// Answers every request 200; the request marked `last` first cancels the
/// batch, as its owner would between two heartbeats.
struct CancelAtLast {
    store: Store,
    project: String,
    batch: String,
}

impl BatchEndpoints for CancelAtLast {
    fn check(
        &self,
        _project: String,
        _endpoint: String,
        _body: Map<String, Value>,
    ) -> BoxFuture<Result<String, String>> {
        Box::pin(async { Ok("m".to_string()) })
    }

    fn run(
        &self,
        _project: String,
        _endpoint: String,
        body: Map<String, Value>,
    ) -> BoxFuture<EndpointReply> {
        let (store, project, batch) =
            (self.store.clone(), self.project.clone(), self.batch.clone());
        Box::pin(async move {
            if body.get("last") == Some(&json!(true)) {
                let cancelled = store.cancel_batch(&project, &batch).await.unwrap();
                assert_eq!(cancelled.status, BatchStatus::Cancelling);
            }
            EndpointReply {
                status: 200,
                body: json!({"id": "x", "object": "embedding"}),
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_last_result_ends_the_batch_cancelled_with_every_result() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project) = common::open_store(dir.path()).await;
    let line = |id: &str, last: bool| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "m", "input": "x", "last": last}})
        .to_string()
    };
    let input = [line("a", false), line("b", true)].join("\n");
    let file = store
        .create_file_from_bytes(&project, "in.jsonl", "batch", input.as_bytes())
        .await
        .unwrap();
    let batch = store
        .create_batch(NewBatch {
            project_id: project.clone(),
            endpoint: "/v1/embeddings".to_string(),
            completion_window: "24h".to_string(),
            input_file_id: file.id.clone(),
            metadata: None,
            override_settings: None,
            expires_at: hearth_store::ids::now() + 86_400,
        })
        .await
        .unwrap();
    let endpoints = Arc::new(CancelAtLast {
        store: store.clone(),
        project: project.clone(),
        batch: batch.id.clone(),
    });
    let config = BatchWorkerConfig {
        worker_id: "node-a".to_string(),
        max_inflight: 1,
        poll: Duration::from_millis(20),
        // The heartbeat does not see the cancel before the batch's end.
        heartbeat: Duration::from_secs(600),
        // A second claim would fail the batch.
        max_attempts: 1,
        ..BatchWorkerConfig::default()
    };
    let worker = BatchWorker::new(store.clone(), endpoints, config, Default::default()).spawn();
    let start = Instant::now();
    let ended = loop {
        let b = store.batch_by_id(&batch.id).await.unwrap();
        if matches!(
            b.status,
            BatchStatus::Completed
                | BatchStatus::Cancelled
                | BatchStatus::Failed
                | BatchStatus::Expired
        ) {
            break b;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "stuck: {b:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    worker.shut_down().await;
    assert_eq!(ended.status, BatchStatus::Cancelled, "{ended:?}");
    assert_eq!((ended.attempts, ended.completed, ended.failed), (1, 2, 0));
    let output = store
        .file_by_id(ended.output_file_id.as_deref().unwrap())
        .await
        .unwrap();
    let bytes: Vec<u8> = store
        .file_content(&output)
        .await
        .unwrap()
        .map_ok(|chunk| chunk.to_vec())
        .try_concat()
        .await
        .unwrap();
    let ids: Vec<String> = String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["custom_id"].to_string())
        .collect();
    assert_eq!(ids, ["\"a\"", "\"b\""]);
}
