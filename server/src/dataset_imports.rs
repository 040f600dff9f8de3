//! This node's import worker: claims queued imports from object storage
//! (`POST /v1/datasets` with a `source`) in the store and reads them
//! (`routes::dataset_import::run`), like the fine-tuning and batch workers
//! claim theirs. Any node on the same store may take an import; the one
//! holding it renews its claim while it reads, and when that node dies the
//! claim goes stale after the node timeout and another node reads the
//! object again from the start (what the dead node stored is left out when
//! the upload completes). An import whose URL this node may not read
//! (`--dataset-import-allow`) is left for a node that may.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_api::datasets::DatasetSource;
use hearth_store::datasets::{ImportClaim, ImportClaimRules};
use tokio::task::JoinSet;

use crate::routes::dataset_import::{check_source, run};
use crate::routes::datasets::delete_blobs;
use crate::state::AppState;

/// Imports read at once on one node.
const AT_ONCE: usize = 2;
/// Longest wait between two looks for queued imports.
const POLL: Duration = Duration::from_secs(1);

type Running = Arc<Mutex<HashSet<String>>>;

/// The running worker; [`ImportWorker::stop`] gives its imports back.
pub struct ImportWorker {
    task: tokio::task::JoinHandle<()>,
    running: Running,
    state: AppState,
}

/// Starts this node's import worker.
pub fn spawn(state: AppState) -> ImportWorker {
    let running: Running = Arc::default();
    let task = tokio::spawn(claim_loop(state.clone(), running.clone()));
    ImportWorker {
        task,
        running,
        state,
    }
}

impl ImportWorker {
    /// Stops reading (the server shuts down in good order) and gives the
    /// imports it held back, for any node to claim at once.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        let ids: Vec<String> = self.running.lock().unwrap().drain().collect();
        let node = self.state.node.worker_id();
        for id in ids {
            match self.state.store.release_import(&id, &node).await {
                Ok(_) => tracing::info!(upload = %id, "dataset import given back"),
                Err(e) => tracing::warn!(upload = %id, "giving a dataset import back: {e}"),
            }
        }
    }
}

async fn claim_loop(state: AppState, running: Running) {
    let node = state.node.worker_id();
    // Imports whose URL this node may not read.
    let mut not_here: Vec<String> = Vec::new();
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        while running.lock().unwrap().len() < AT_ONCE {
            let mut skip: Vec<String> = running.lock().unwrap().iter().cloned().collect();
            skip.extend(not_here.iter().cloned());
            let rules = ImportClaimRules {
                node: &node,
                stale_after_secs: state.node.timeout_secs,
                skip: &skip,
                max_attempts: hearth_store::fine_tuning::DEFAULT_MAX_ATTEMPTS,
            };
            let claim = match state.store.claim_import(&rules).await {
                Ok((claim, dropped)) => {
                    delete_blobs(&state, dropped).await;
                    claim
                }
                Err(e) => {
                    tracing::warn!("looking for dataset imports: {e}");
                    None
                }
            };
            let Some(claim) = claim else { break };
            let id = claim.upload.id.clone();
            let source = claim
                .upload
                .source
                .clone()
                .and_then(|s| serde_json::from_value::<DatasetSource>(s).ok());
            let checked = source.as_ref().map(|s| check_source(&state, s));
            match checked {
                Some(Ok((url, format))) => {
                    running.lock().unwrap().insert(id.clone());
                    let (state, running) = (state.clone(), running.clone());
                    tasks.spawn(async move {
                        read(&state, claim, url, format).await;
                        running.lock().unwrap().remove(&id);
                        state.datasets.import_wake.notify_one();
                    });
                }
                Some(Err(refused)) => {
                    // Another node (with other allowed prefixes) may read it.
                    tracing::info!(upload = %id, "dataset import left for another node: {}",
                        refused.0.message());
                    let _ = state.store.release_import(&id, &node).await;
                    not_here.push(id);
                }
                None => {
                    let message = "the stored source of the import cannot be read";
                    if let Ok(keys) = state.store.fail_import(&id, &node, message).await {
                        delete_blobs(&state, keys).await;
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {},
            _ = state.datasets.import_wake.notified() => {},
        }
    }
}

/// Reads one claimed import while renewing the claim; stops at once when
/// the claim is lost (another node took it over).
async fn read(
    state: &AppState,
    claim: ImportClaim,
    url: url::Url,
    format: hearth_store::datasets::table::PartFormat,
) {
    let node = state.node.worker_id();
    let id = claim.upload.id.clone();
    tracing::info!(upload = %id, url = %url, attempt = claim.attempt, "dataset import claimed");
    let schema = Some(claim.upload.schema.clone()).filter(|s| !s.is_empty());
    let every = Duration::from_secs((state.node.timeout_secs / 4).clamp(1, 10) as u64);
    let renew = async {
        loop {
            tokio::time::sleep(every).await;
            match state.store.renew_import(&id, &node).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => tracing::warn!(upload = %id, "renewing a dataset import's claim: {e}"),
            }
        }
    };
    let outcome = tokio::select! {
        outcome = run(state, &id, &url, format, schema) => outcome,
        () = renew => Ok(false),
    };
    match outcome {
        Ok(true) => {}
        Ok(false) => tracing::warn!(upload = %id, "dataset import taken over by another node"),
        Err(message) => {
            tracing::warn!(upload = %id, "dataset import failed: {message}");
            match state.store.fail_import(&id, &node, &message).await {
                Ok(keys) => delete_blobs(state, keys).await,
                Err(e) => tracing::warn!(upload = %id, "recording a failed import: {e}"),
            }
        }
    }
}
