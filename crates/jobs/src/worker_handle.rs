//! A started fine-tuning [`crate::Worker`]: what a server that stops in
//! good order calls to give its running jobs back.

use std::sync::{Arc, Mutex};

use hearth_store::Store;

/// A started [`crate::Worker`].
pub struct WorkerHandle {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) store: Store,
    pub(crate) worker_id: String,
    pub(crate) running: Arc<Mutex<Vec<String>>>,
}

impl WorkerHandle {
    /// For a shutdown in good order: stops claiming, and gives the jobs it
    /// runs back to the queue (their attempt not counted), to be resumed
    /// from their latest checkpoint by whichever node claims them next.
    /// Their training threads stop at their next step.
    pub async fn shut_down(self) {
        self.task.abort();
        let _ = self.task.await;
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for id in running {
            match self.store.release_ft_job(&id, &self.worker_id).await {
                Ok(true) => {
                    tracing::info!(job = %id, "fine-tuning job given back to the queue");
                    let _ = self
                        .store
                        .add_ft_event(
                            &id,
                            "info",
                            "message",
                            "Paused: the server shut down; the job resumes from its latest \
                             checkpoint when a server takes it again",
                            None,
                        )
                        .await;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(job = %id, error = %e, "cannot give a job back"),
            }
        }
    }
}
