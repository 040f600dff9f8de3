//! A started fine-tuning [`crate::Worker`]: what a server that stops in
//! good order calls to give its running jobs back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_store::Store;

use crate::worker::Running;

/// How long [`WorkerHandle::shut_down`] waits for the training threads to
/// stop (each stops at its next step) before it returns regardless.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// A started [`crate::Worker`].
pub struct WorkerHandle {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) store: Store,
    pub(crate) worker_id: String,
    pub(crate) running: Arc<Mutex<Vec<Running>>>,
}

impl WorkerHandle {
    /// For a shutdown in good order: stops claiming, and gives the jobs it
    /// runs back to the queue (their attempt not counted), to be resumed
    /// from their latest checkpoint by whichever node claims them next.
    /// Their training threads are told to stop and waited for (each stops
    /// at its next step; at most 30 s), so that none of them
    /// writes to the store after the runtime it writes through is gone.
    pub async fn shut_down(self) {
        self.task.abort();
        let _ = self.task.await;
        let running: Vec<String> = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| r.id.clone())
            .collect();
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
        stop_training(&self.running).await;
    }
}

/// Raises every running job's stop flag, then waits until their threads
/// have ended (at most [`STOP_WAIT`]).
async fn stop_training(running: &Mutex<Vec<Running>>) {
    let start = Instant::now();
    loop {
        let left = {
            let running = running.lock().unwrap_or_else(|e| e.into_inner());
            for r in running.iter() {
                r.cancelled.store(true, Ordering::SeqCst);
            }
            running.len()
        };
        if left == 0 {
            return;
        }
        if start.elapsed() >= STOP_WAIT {
            tracing::warn!(jobs = left, "training threads still running at shutdown");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
