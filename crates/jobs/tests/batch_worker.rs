//! The batch worker over endpoint doubles (no model): a cancel that lands
//! after the last result, before the worker's heartbeat sees it, or after
//! the heartbeat saw the window pass, still ends the batch `cancelled`
//! with its results, in the attempt that ran it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use hearth_jobs::batch::BoxFuture;
use hearth_jobs::{BatchEndpoints, BatchWorker, BatchWorkerConfig, EndpointReply};
use hearth_store::{BatchStatus, NewBatch, Store};
use serde_json::{json, Map, Value};

/// When an endpoint double cancels the batch it runs, as its owner could.
#[derive(Clone, Copy)]
enum CancelWhen {
    /// Before answering the request marked `last` (every request answers
    /// 200): after the last result, before a heartbeat sees the cancel.
    AtLast,
    /// When the worker drops the request (which never answers) because the
    /// window passed: between the heartbeat's read and the batch's end.
    Dropped,
}

/// Endpoints that answer without a model and cancel their batch `when`.
struct Canceller {
    store: Store,
    project: String,
    batch: String,
    when: CancelWhen,
}

struct CancelOnDrop(Store, String, String);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Self(store, project, batch) = self;
        let handle = tokio::runtime::Handle::current();
        let cancelled =
            tokio::task::block_in_place(|| handle.block_on(store.cancel_batch(project, batch)));
        assert_eq!(cancelled.unwrap().status, BatchStatus::Cancelling);
    }
}

impl BatchEndpoints for Canceller {
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
        _line_key: String,
    ) -> BoxFuture<EndpointReply> {
        let (store, project, batch) =
            (self.store.clone(), self.project.clone(), self.batch.clone());
        match self.when {
            CancelWhen::AtLast => Box::pin(async move {
                if body.get("last") == Some(&json!(true)) {
                    let cancelled = store.cancel_batch(&project, &batch).await.unwrap();
                    assert_eq!(cancelled.status, BatchStatus::Cancelling);
                }
                EndpointReply {
                    status: 200,
                    body: json!({"id": "x", "object": "embedding"}),
                }
            }),
            CancelWhen::Dropped => {
                let guard = CancelOnDrop(store, project, batch);
                Box::pin(async move {
                    let _guard = guard;
                    std::future::pending::<EndpointReply>().await
                })
            }
        }
    }
}

/// A batch of `lines` on `/v1/embeddings` whose window ends at `expires_at`.
async fn batch_of(store: &Store, project: &str, lines: &[String], expires_at: i64) -> String {
    let file = store
        .create_file_from_bytes(project, "in.jsonl", "batch", lines.join("\n").as_bytes())
        .await
        .unwrap();
    let batch = store
        .create_batch(NewBatch {
            project_id: project.to_string(),
            endpoint: "/v1/embeddings".to_string(),
            completion_window: "24h".to_string(),
            input_file_id: file.id.clone(),
            metadata: None,
            override_settings: None,
            expires_at,
        })
        .await
        .unwrap();
    batch.id
}

/// Runs a worker (one attempt allowed: a second claim would fail the
/// batch) until batch `id` ends.
async fn run_to_end(
    store: &Store,
    id: &str,
    endpoints: Arc<dyn BatchEndpoints>,
    heartbeat: Duration,
) -> hearth_store::Batch {
    let config = BatchWorkerConfig {
        worker_id: "node-a".to_string(),
        max_inflight: 1,
        poll: Duration::from_millis(20),
        heartbeat,
        max_attempts: 1,
        ..BatchWorkerConfig::default()
    };
    let worker = BatchWorker::new(store.clone(), endpoints, config, Default::default()).spawn();
    let start = Instant::now();
    let ended = loop {
        let b = store.batch_by_id(id).await.unwrap();
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
    ended
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
    let lines = [line("a", false), line("b", true)];
    let id = batch_of(&store, &project, &lines, hearth_store::ids::now() + 86_400).await;
    let endpoints = Arc::new(Canceller {
        store: store.clone(),
        project: project.clone(),
        batch: id.clone(),
        when: CancelWhen::AtLast,
    });
    // The heartbeat does not see the cancel before the batch's end.
    let ended = run_to_end(&store, &id, endpoints, Duration::from_secs(600)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_window_passed_ends_the_batch_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (store, project) = common::open_store(dir.path()).await;
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": "m", "input": "x"}})
    .to_string();
    // The window has passed already; the first heartbeat (after the line
    // started) says so, and the dropped line cancels the batch.
    let id = batch_of(&store, &project, &[line], hearth_store::ids::now() - 1).await;
    let endpoints = Arc::new(Canceller {
        store: store.clone(),
        project: project.clone(),
        batch: id.clone(),
        when: CancelWhen::Dropped,
    });
    let ended = run_to_end(&store, &id, endpoints, Duration::from_secs(2)).await;
    assert_eq!(ended.status, BatchStatus::Cancelled, "{ended:?}");
    assert_eq!((ended.attempts, ended.completed, ended.failed), (1, 0, 0));
    assert!(
        ended.cancelled_at.is_some() && ended.expired_at.is_none(),
        "{ended:?}"
    );
}
