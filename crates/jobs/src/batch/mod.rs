//! The batch worker: claims batches from the store and runs their requests
//! through the server's endpoints at batch priority.
//!
//! - Claiming goes through the database ([`Store::claim_batch`]), so a batch
//!   survives a restart and, on PostgreSQL, any node may take it; a node
//!   runs at most [`BatchWorkerConfig::batches`] at once.
//! - A batch is checked whole before any request runs (`validating`): every
//!   line parsed, `url` the batch's endpoint, `custom_id` unique, one model,
//!   each body accepted by its endpoint's own checks, at most
//!   [`BatchWorkerConfig::max_lines`] lines. A bad file fails the batch with
//!   the line numbers in `errors`.
//! - Requests run through [`BatchEndpoints`], the same code as the HTTP
//!   routes, at most [`BatchWorkerConfig::max_inflight`] at once across the
//!   node's batches; the engine admits them after interactive requests.
//! - Each result is committed with its line number as it arrives; a batch
//!   claimed again after a crash runs only the lines without a result, so
//!   no line is lost or run twice.
//! - A heartbeat renews the claim and reads the status: a cancel (or the
//!   completion window passing) drops the requests in flight, whose
//!   sequences the engine then aborts, and the results so far are written.

mod run;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_store::{BatchClaimRules, Store};
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use crate::worker::default_worker_id;

/// A boxed future that owns what it needs.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What an endpoint answered to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointReply {
    /// The HTTP status it would have answered.
    pub status: u16,
    /// Its JSON body (the result object, or the error body).
    pub body: Value,
}

/// How the worker reaches the endpoints; the server's implementation runs
/// each request through the same code as its HTTP route.
pub trait BatchEndpoints: Send + Sync + 'static {
    /// Checks a request body as `endpoint` checks it before running
    /// anything (fields, ranges, the model): the model it names, or what is
    /// wrong.
    fn check(
        &self,
        project: String,
        endpoint: String,
        body: Map<String, Value>,
    ) -> BoxFuture<Result<String, String>>;

    /// Runs a request at batch priority. `line_key` names the line (its
    /// batch and line number) and is the same on every run of it: a line
    /// whose result was not recorded (a node stopped or killed mid-run) is
    /// run again, and an endpoint that keeps what it answers (a stored
    /// response) names it by this key so the rerun replaces it rather than
    /// keeping two.
    fn run(
        &self,
        project: String,
        endpoint: String,
        body: Map<String, Value>,
        line_key: String,
    ) -> BoxFuture<EndpointReply>;
}

#[derive(Clone)]
pub struct BatchWorkerConfig {
    /// This node's name in `claimed_by`; a restarted node takes back its
    /// own batches at once.
    pub worker_id: String,
    /// Batches run at once on this node.
    pub batches: usize,
    /// Requests in flight at once, across this node's batches.
    pub max_inflight: usize,
    /// Most lines an input file may hold.
    pub max_lines: usize,
    /// How often to look for batches to claim.
    pub poll: Duration,
    /// How often a running batch renews its claim and reads its status.
    pub heartbeat: Duration,
    /// A batch whose heartbeat is older than this is taken over.
    pub stale_after_secs: i64,
    /// Claims a batch may have; the one past them fails it.
    pub max_attempts: i64,
}

/// Default of [`BatchWorkerConfig::max_lines`] (OpenAI's).
pub const DEFAULT_MAX_LINES: usize = 50_000;

impl Default for BatchWorkerConfig {
    fn default() -> Self {
        Self {
            worker_id: default_worker_id(),
            batches: 2,
            max_inflight: 32,
            max_lines: DEFAULT_MAX_LINES,
            poll: Duration::from_secs(1),
            heartbeat: Duration::from_secs(1),
            stale_after_secs: 30,
            max_attempts: hearth_store::fine_tuning::DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// Requests this node's batches ran, for `/metrics`.
#[derive(Debug, Default)]
pub struct BatchCounters {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
}

impl BatchCounters {
    /// (completed, failed) so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.completed.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// Claims and runs batches until the process ends.
pub struct BatchWorker {
    store: Store,
    endpoints: Arc<dyn BatchEndpoints>,
    config: BatchWorkerConfig,
    counters: Arc<BatchCounters>,
}

/// The batches this process runs now, each with the task running it.
type Running = Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>;

impl BatchWorker {
    /// A worker counting the requests it runs in `counters`.
    pub fn new(
        store: Store,
        endpoints: Arc<dyn BatchEndpoints>,
        config: BatchWorkerConfig,
        counters: Arc<BatchCounters>,
    ) -> Self {
        Self {
            store,
            endpoints,
            config,
            counters,
        }
    }

    /// Starts the claim loop on the current tokio runtime.
    pub fn spawn(self) -> BatchWorkerHandle {
        let running: Running = Arc::default();
        BatchWorkerHandle {
            store: self.store.clone(),
            worker_id: self.config.worker_id.clone(),
            running: running.clone(),
            task: tokio::spawn(self.run(running)),
        }
    }

    async fn run(self, running: Running) {
        let slots = Arc::new(Semaphore::new(self.config.batches.max(1)));
        let inflight = Arc::new(Semaphore::new(self.config.max_inflight.max(1)));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let running_here: Vec<String> = lock(&running).keys().cloned().collect();
            let rules = BatchClaimRules {
                running_here: &running_here,
                max_attempts: self.config.max_attempts,
                ..BatchClaimRules::new(&self.config.worker_id, self.config.stale_after_secs)
            };
            match self.store.claim_batch(&rules).await {
                Ok(Some(batch)) => {
                    tracing::info!(
                        batch = %batch.id,
                        status = %batch.status,
                        attempt = batch.attempts,
                        "batch claimed"
                    );
                    let id = batch.id.clone();
                    let job = run::BatchRun {
                        store: self.store.clone(),
                        endpoints: self.endpoints.clone(),
                        config: self.config.clone(),
                        inflight: inflight.clone(),
                        counters: self.counters.clone(),
                    };
                    // Registered before it starts, so that a fast batch's
                    // own removal comes after this insert.
                    let mut map = lock(&running);
                    let done = running.clone();
                    let task_id = id.clone();
                    let task = tokio::spawn(async move {
                        job.run(batch).await;
                        lock(&done).remove(&task_id);
                        drop(permit);
                    });
                    map.insert(id, task.abort_handle());
                }
                Ok(None) => {
                    drop(permit);
                    tokio::time::sleep(self.config.poll).await;
                }
                Err(e) => {
                    drop(permit);
                    tracing::warn!(error = %e, "cannot claim batches");
                    tokio::time::sleep(self.config.poll * 5).await;
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A started [`BatchWorker`].
pub struct BatchWorkerHandle {
    task: tokio::task::JoinHandle<()>,
    store: Store,
    worker_id: String,
    running: Running,
}

impl BatchWorkerHandle {
    /// The batches running on this node now.
    pub fn running(&self) -> Vec<String> {
        lock(&self.running).keys().cloned().collect()
    }

    /// For a shutdown in good order: stops claiming, drops the requests in
    /// flight, and gives the batches back to the queue (their attempt not
    /// counted); whichever node claims them next runs the lines that have
    /// no result yet.
    pub async fn shut_down(self) {
        self.task.abort();
        let _ = self.task.await;
        let running: Vec<(String, tokio::task::AbortHandle)> =
            lock(&self.running).drain().collect();
        for (id, task) in running {
            task.abort();
            match self.store.release_batch(&id, &self.worker_id).await {
                Ok(true) => tracing::info!(batch = %id, "batch given back to the queue"),
                Ok(false) => {}
                Err(e) => tracing::warn!(batch = %id, error = %e, "cannot give a batch back"),
            }
        }
    }
}
