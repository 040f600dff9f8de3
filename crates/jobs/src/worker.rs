//! The fine-tuning worker: claims jobs from the store and trains them on
//! threads of their own, writing progress, events, checkpoints and results
//! back to the store.
//!
//! - Claiming goes through the database ([`Store::claim_ft_job`]), so a job
//!   survives a restart and, on PostgreSQL, any node may take it. A node takes
//!   at most [`WorkerConfig::max_jobs`] jobs at once (one by default).
//! - A heartbeat task renews the claim every few seconds; when the job is no
//!   longer running under this worker (cancelled), it raises a flag that the
//!   training loop reads before every step, so a cancel stops the work at the
//!   next step.
//! - A shutdown in good order ([`crate::WorkerHandle::shut_down`]) gives the
//!   running jobs back to the queue, raises their flags and waits (at most
//!   30 s) for their threads to end, so that none is left writing to the
//!   store through a runtime that is going away.
//! - Each job trains inside its own rayon pool of [`WorkerConfig::threads`]
//!   threads running at a lower CPU priority (`nice`), so interactive
//!   requests keep their latency: the serving threads win the CPU whenever
//!   they want it.
//! - A node claims only jobs for the models it trains ([`Worker::new`]'s
//!   bases), never one it is already running, and every state write checks
//!   that it still holds the claim (a worker whose job was taken over stops).
//!   Each claim is an attempt: a job whose worker died
//!   [`WorkerConfig::max_attempts`] times is failed instead of claimed again.
//! - Checkpoints are PEFT adapters plus the full training state in the blob
//!   store under `fine_tuning/<job>/step-<n>/`, written at the end of every
//!   epoch, every [`WorkerConfig::checkpoint_every`] steps, at least every
//!   [`WorkerConfig::checkpoint_interval`] of training, and at the end. A job
//!   claimed again after a crash resumes from its latest checkpoint, and the
//!   steps it trains again are not logged twice.
//! - Each checkpoint's adapter is also published as two files of the job's
//!   project (`adapter_model.safetensors`, `adapter_config.json`, purpose
//!   `fine-tune-results`), listed in the checkpoint's `result_files`; the job
//!   ends with the metrics CSV and the last checkpoint's two files in its
//!   `result_files`. Files commit with the row that lists them
//!   (`hearth_store::fine_tuning::results`), so a resume never leaves
//!   duplicates.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hearth_api::fine_tuning::Hyperparameters;
use hearth_api::training_data::{parse_training_file, TrainingExample};
use hearth_store::fine_tuning::{FtJob, FtStatus, DEFAULT_MAX_ATTEMPTS};
use hearth_store::{ClaimRules, Store};
use serde_json::{json, Value};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use crate::progress::{logged, step_data, step_message, STARTED};
use crate::worker_handle::WorkerHandle;
use crate::{load_chat_parts, BaseModel, TrainConfig, TrainError, Trainer};

mod results;

pub const ADAPTER_WEIGHTS: &str = hearth_models::lora::ADAPTER_WEIGHTS_FILE;
pub const ADAPTER_CONFIG: &str = hearth_models::lora::ADAPTER_CONFIG_FILE;
/// The trainer's full state (LoRA weights, optimizer moments, step) next to
/// each checkpoint's adapter.
pub const TRAINING_STATE: &str = "training_state.bin";

#[derive(Clone)]
pub struct WorkerConfig {
    /// This node's name in `claimed_by`; a restarted node takes back its
    /// own running jobs at once.
    pub worker_id: String,
    /// Jobs trained at once on this node.
    pub max_jobs: usize,
    /// Training threads per job.
    pub threads: usize,
    /// Steps between checkpoints (the end of each epoch and the last step
    /// always get one).
    pub checkpoint_every: usize,
    /// Longest training time between checkpoints: what a crash can lose.
    pub checkpoint_interval: Duration,
    /// Claims a job may have (the first and one per worker that died
    /// running it); the claim past them fails the job.
    pub max_attempts: i64,
    /// How often to look for queued jobs.
    pub poll: Duration,
    /// A running job whose heartbeat is older than this is taken over.
    pub stale_after_secs: i64,
    /// CPU priority of the training threads (0 = as serving, 19 = lowest,
    /// which also puts them in Linux's idle scheduling class).
    pub nice: i32,
    /// Whether serving has work (requests running or waiting): between
    /// steps, training waits while it does, at most `yield_max` per step.
    pub serving_busy: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// Longest wait for serving before a step runs anyway (so training
    /// still progresses under constant load).
    pub yield_max: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            worker_id: default_worker_id(),
            max_jobs: 1,
            threads: 1,
            checkpoint_every: 20,
            checkpoint_interval: Duration::from_secs(120),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            poll: Duration::from_secs(1),
            stale_after_secs: 60,
            nice: 19,
            serving_busy: None,
            yield_max: Duration::from_secs(30),
        }
    }
}

/// `HEARTH_NODE_ID`, else the host name.
pub fn default_worker_id() -> String {
    std::env::var("HEARTH_NODE_ID")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "hearth".to_string())
}

/// The name a succeeded job's model is served under:
/// `<base>:<suffix>:<job id>` (`<base>:<job id>` without a suffix).
pub fn fine_tuned_model_name(job: &FtJob) -> String {
    match job.suffix.as_deref().filter(|s| !s.is_empty()) {
        Some(suffix) => format!("{}:{suffix}:{}", job.model, job.id),
        None => format!("{}:{}", job.model, job.id),
    }
}

/// Claims and runs jobs until the process ends.
pub struct Worker {
    store: Store,
    bases: Arc<BTreeMap<String, BaseModel>>,
    config: WorkerConfig,
    /// Jobs this process runs now: never claimed a second time.
    running: Arc<Mutex<Vec<Running>>>,
}

impl Worker {
    /// A worker training jobs whose `model` is a key of `bases` (the
    /// trainable models served by this node).
    pub fn new(store: Store, bases: BTreeMap<String, BaseModel>, config: WorkerConfig) -> Self {
        Self {
            store,
            bases: Arc::new(bases),
            config,
            running: Arc::default(),
        }
    }

    /// Starts the claim loop on the current tokio runtime.
    pub fn spawn(self) -> WorkerHandle {
        WorkerHandle {
            store: self.store.clone(),
            worker_id: self.config.worker_id.clone(),
            running: self.running.clone(),
            task: tokio::spawn(self.run()),
        }
    }

    async fn run(self) {
        let slots = Arc::new(Semaphore::new(self.config.max_jobs.max(1)));
        let models: Vec<String> = self.bases.keys().cloned().collect();
        let running = self.running.clone();
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let running_here: Vec<String> = running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|r| r.id.clone())
                .collect();
            let rules = ClaimRules {
                models: Some(&models),
                running_here: &running_here,
                max_attempts: self.config.max_attempts,
                ..ClaimRules::new(&self.config.worker_id, self.config.stale_after_secs)
            };
            match self.store.claim_ft_job(&rules).await {
                Ok(Some(job)) => {
                    tracing::info!(
                        job = %job.id,
                        model = %job.model,
                        attempt = job.attempts,
                        "fine-tuning job claimed"
                    );
                    let cancelled = Arc::new(AtomicBool::new(false));
                    let ctx = JobContext {
                        store: self.store.clone(),
                        bases: self.bases.clone(),
                        config: self.config.clone(),
                        handle: Handle::current(),
                        cancelled: cancelled.clone(),
                    };
                    running
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Running {
                            id: job.id.clone(),
                            cancelled,
                        });
                    let running = running.clone();
                    tokio::spawn(async move {
                        let id = job.id.clone();
                        ctx.run(job).await;
                        running
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .retain(|r| r.id != id);
                        drop(permit);
                    });
                }
                Ok(None) => {
                    drop(permit);
                    tokio::time::sleep(self.config.poll).await;
                }
                Err(e) => {
                    drop(permit);
                    tracing::warn!(error = %e, "cannot claim fine-tuning jobs");
                    tokio::time::sleep(self.config.poll * 5).await;
                }
            }
        }
    }
}

/// A job this worker runs, and the flag that stops its training thread at
/// its next step.
pub(crate) struct Running {
    pub(crate) id: String,
    pub(crate) cancelled: Arc<AtomicBool>,
}

/// Why a job stopped without succeeding.
enum Stop {
    /// Cancelled, or no longer this worker's (taken over after a stale
    /// heartbeat): nothing more to write.
    Cancelled,
    Failed {
        code: &'static str,
        message: String,
    },
}

impl From<TrainError> for Stop {
    fn from(e: TrainError) -> Self {
        let code = match e {
            TrainError::Data(_) => "invalid_training_file",
            TrainError::Config(_) => "invalid_hyperparameters",
            _ => "training_failed",
        };
        Stop::Failed {
            code,
            message: e.to_string(),
        }
    }
}

impl From<hearth_store::StoreError> for Stop {
    fn from(e: hearth_store::StoreError) -> Self {
        Stop::Failed {
            code: "internal_error",
            message: format!("storage: {e}"),
        }
    }
}

impl From<candle_core::Error> for Stop {
    fn from(e: candle_core::Error) -> Self {
        TrainError::from(e).into()
    }
}

struct JobContext {
    store: Store,
    bases: Arc<BTreeMap<String, BaseModel>>,
    config: WorkerConfig,
    handle: Handle,
    cancelled: Arc<AtomicBool>,
}

impl JobContext {
    async fn run(self, job: FtJob) {
        let heartbeat = self.spawn_heartbeat(&job.id);
        let store = self.store.clone();
        let job_id = job.id.clone();
        let worker = self.config.worker_id.clone();
        let ctx = Arc::new(self);
        let result = {
            let ctx = ctx.clone();
            tokio::task::spawn_blocking(move || ctx.train_on_own_pool(job)).await
        };
        heartbeat.abort();
        let outcome = match result {
            Ok(r) => r,
            Err(e) => Err(Stop::Failed {
                code: "internal_error",
                message: format!("the training thread stopped: {e}"),
            }),
        };
        match outcome {
            Ok(()) => tracing::info!(job = %job_id, "fine-tuning job succeeded"),
            Err(Stop::Cancelled) => {
                tracing::info!(job = %job_id, "fine-tuning job cancelled; stopped")
            }
            Err(Stop::Failed { code, message }) => {
                tracing::warn!(job = %job_id, %message, "fine-tuning job failed");
                let error = json!({"code": code, "message": message, "param": null});
                let ended = store
                    .finish_ft_job(&job_id, &worker, FtStatus::Failed, None, &[], Some(error))
                    .await;
                if matches!(ended, Ok(true)) {
                    let _ = store
                        .add_ft_event(
                            &job_id,
                            "error",
                            "message",
                            &format!("Training failed: {message}"),
                            None,
                        )
                        .await;
                }
            }
        }
    }

    /// Renews the claim every few seconds; raises `cancelled` once the job
    /// is no longer running under this worker.
    fn spawn_heartbeat(&self, job_id: &str) -> tokio::task::JoinHandle<()> {
        let (store, id, worker, flag) = (
            self.store.clone(),
            job_id.to_string(),
            self.config.worker_id.clone(),
            self.cancelled.clone(),
        );
        let every = Duration::from_secs((self.config.stale_after_secs / 4).clamp(1, 10) as u64);
        tokio::spawn(async move {
            loop {
                match store.heartbeat_ft_job(&id, &worker).await {
                    Ok(true) => {}
                    Ok(false) => {
                        flag.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(e) => tracing::warn!(job = %id, error = %e, "heartbeat failed"),
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    fn train_on_own_pool(&self, job: FtJob) -> Result<(), Stop> {
        let nice = self.config.nice;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.config.threads.max(1))
            .thread_name(|i| format!("hearth-train-{i}"))
            .start_handler(move |_| lower_thread_priority(nice))
            .build()
            .map_err(|e| Stop::Failed {
                code: "internal_error",
                message: format!("cannot start training threads: {e}"),
            })?;
        let result = pool.install(|| self.train(job));
        drop(pool);
        release_freed_memory();
        result
    }

    /// Waits while serving has requests in flight (at most `yield_max`,
    /// and not past a cancel): a step shares the CPU's cores, caches and
    /// memory bandwidth with serving whatever the threads' priority.
    fn yield_to_serving(&self) {
        let Some(busy) = &self.config.serving_busy else {
            return;
        };
        let start = std::time::Instant::now();
        while busy()
            && start.elapsed() < self.config.yield_max
            && !self.cancelled.load(Ordering::SeqCst)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    /// Logs an event while the job is still this worker's and running: a
    /// job cancelled (or taken over) gets no more events from it.
    fn event(&self, job: &str, kind: &str, message: String, data: Option<Value>) {
        let worker = &self.config.worker_id;
        let written = self.block_on(
            self.store
                .add_held_ft_event(job, worker, "info", kind, &message, data),
        );
        if let Err(e) = written {
            tracing::warn!(job, error = %e, "cannot record an event");
        }
    }

    fn read_dataset(
        &self,
        project_id: &str,
        file_id: &str,
        which: &str,
    ) -> Result<Vec<TrainingExample>, Stop> {
        let bytes = self
            .block_on(async {
                use futures_util::TryStreamExt;
                // A dataset (`dataset-...`) trains from its `messages` or
                // `prompt`/`completion` columns, read from its Parquet parts.
                let content = if hearth_store::datasets::names_dataset(file_id) {
                    let dataset = self.store.dataset_by_id(file_id).await?;
                    if dataset.project_id != project_id {
                        return Err(hearth_store::StoreError::NotFound("dataset"));
                    }
                    self.store.dataset_training_lines(&dataset).await?
                } else {
                    let file = self.store.file(project_id, file_id).await?;
                    self.store.file_content(&file).await?
                };
                let chunks: Vec<bytes::Bytes> = content.try_collect().await?;
                Ok::<_, hearth_store::StoreError>(chunks.concat())
            })
            .map_err(|e| match e {
                hearth_store::StoreError::Invalid(_) | hearth_store::StoreError::NotFound(_) => {
                    Stop::Failed {
                        code: "invalid_training_file",
                        message: format!("the {which} file {file_id}: {e}"),
                    }
                }
                e => e.into(),
            })?;
        let text = String::from_utf8(bytes).map_err(|_| Stop::Failed {
            code: "invalid_training_file",
            message: format!("the {which} file {file_id} is not UTF-8"),
        })?;
        parse_training_file(&text).map_err(|m| Stop::Failed {
            code: "invalid_training_file",
            message: format!("the {which} file {file_id}: {m}"),
        })
    }

    /// Sets the job's progress while it is still running under this
    /// worker (the write itself checks it, so a step that ends after a
    /// cancel changes nothing) and renews the claim: a job cancelled, or
    /// no longer this worker's, stops here, at the step after the change
    /// rather than at the heartbeat's next beat (seconds later, steps and
    /// a checkpoint further on).
    fn progress(&self, job: &str, steps: usize, tokens: i64, total: usize) -> Result<(), Stop> {
        let worker = &self.config.worker_id;
        let held = self.block_on(async {
            let recorded = self
                .store
                .update_ft_progress(job, worker, steps as i64, tokens, total as i64)
                .await?;
            Ok::<_, hearth_store::StoreError>(
                recorded && self.store.heartbeat_ft_job(job, worker).await?,
            )
        })?;
        if held {
            Ok(())
        } else {
            self.cancelled.store(true, Ordering::SeqCst);
            Err(Stop::Cancelled)
        }
    }

    fn train(&self, job: FtJob) -> Result<(), Stop> {
        let base = self.bases.get(&job.model).ok_or_else(|| Stop::Failed {
            code: "model_unavailable",
            message: format!("the base model {} is not loaded on this node", job.model),
        })?;
        let train = self.read_dataset(&job.project_id, &job.training_file, "training")?;
        let valid = match &job.validation_file {
            Some(id) => Some(self.read_dataset(&job.project_id, id, "validation")?),
            None => None,
        };
        let config = train_config(&job.hyperparameters, job.seed)?;
        let parts = load_chat_parts(base)?;
        let mut trainer = Trainer::new(
            base,
            &job.model,
            &parts.tokenizer,
            &parts.template,
            &parts.eos_ids,
            &train,
            valid.as_deref(),
            config,
        )?;
        let total = trainer.total_steps();
        let mut trained_tokens: i64 = 0;
        // What an earlier run of the job (before a crash or a shutdown)
        // already logged.
        let before = self.block_on(logged(&self.store, &job.id))?;
        let logged_through = before.last_step();
        // Which node (re)started it: a takeover shows in the events.
        let on_node = Some(serde_json::json!({"node": self.config.worker_id}));
        match self.block_on(self.store.latest_ft_checkpoint(&job.id))? {
            Some(ckpt) => {
                let key = format!("{}/{TRAINING_STATE}", ckpt.blob_prefix);
                let state = self.block_on(self.store.blobs().get(&key))?;
                trainer.restore_state(&state)?;
                trained_tokens = ckpt.metrics["trained_tokens"].as_i64().unwrap_or(0);
                self.event(
                    &job.id,
                    "message",
                    format!(
                        "Resumed training from checkpoint at step {} of {total}",
                        trainer.step(),
                    ),
                    on_node.clone(),
                );
            }
            None if before.started => self.event(
                &job.id,
                "message",
                "Restarted training from the beginning: no checkpoint yet".to_string(),
                on_node,
            ),
            None => self.event(
                &job.id,
                "message",
                format!("{STARTED}: {} examples, {total} steps", train.len()),
                on_node,
            ),
        }
        self.progress(&job.id, trainer.step(), trained_tokens, total)?;
        let name = fine_tuned_model_name(&job);
        let mut last_commit = Instant::now();
        while trainer.step() < total {
            self.yield_to_serving();
            if self.cancelled.load(Ordering::SeqCst) {
                return Err(Stop::Cancelled);
            }
            let report = trainer.train_step()?;
            trained_tokens += report.tokens as i64;
            self.progress(&job.id, report.step, trained_tokens, total)?;
            if report.step as i64 > logged_through {
                self.event(
                    &job.id,
                    "metrics",
                    step_message(&report, total),
                    Some(step_data(&report)),
                );
            }
            let every = self.config.checkpoint_every.max(1);
            if report.step % every == 0
                || report.epoch_end
                || report.step == total
                || last_commit.elapsed() >= self.config.checkpoint_interval
            {
                self.checkpoint(&job, &trainer, &report, &name, trained_tokens)?;
                last_commit = Instant::now();
            }
        }
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(Stop::Cancelled);
        }
        let applied = self.publish_success(&job, &name)?;
        if !applied {
            return Err(Stop::Cancelled);
        }
        // The job is no longer running: logged without the claim check.
        let done = format!("The job has successfully completed; the model {name} is ready");
        if let Err(e) = self.block_on(
            self.store
                .add_ft_event(&job.id, "info", "message", &done, None),
        ) {
            tracing::warn!(job = %job.id, error = %e, "cannot record an event");
        }
        Ok(())
    }
}

/// The trainer's settings from the job's stored (resolved) hyperparameters
/// (the API's [`Hyperparameters`], as written at creation).
fn train_config(h: &Value, seed: i64) -> Result<TrainConfig, Stop> {
    let h: Hyperparameters = serde_json::from_value(h.clone()).map_err(|e| Stop::Failed {
        code: "invalid_hyperparameters",
        message: format!("the stored hyperparameters do not parse: {e}"),
    })?;
    Ok(TrainConfig {
        n_epochs: h.n_epochs as usize,
        batch_size: h.batch_size as usize,
        learning_rate: h.learning_rate,
        warmup_ratio: h.warmup_ratio,
        weight_decay: h.weight_decay,
        max_grad_norm: h.max_grad_norm,
        packing: h.packing,
        context_length: h.context_length as usize,
        lora_r: h.lora_r as usize,
        lora_alpha: h.lora_alpha as f64,
        lora_dropout: h.lora_dropout,
        seed: seed as u64,
        ..TrainConfig::default()
    })
}

/// Returns what a finished job freed to the system. glibc keeps freed
/// blocks under its mmap threshold in the arena of the thread that freed
/// them (each training thread has one) until they are trimmed; without
/// this a server that ran jobs kept hundreds of megabytes more than before
/// them, and more after each job.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the heaps to the
    // system; it is safe to call at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Lowers the calling thread's CPU priority (Linux threads have their own
/// nice value).
fn lower_thread_priority(nice: i32) {
    // SAFETY: both calls only change the calling thread's (`0`) scheduling;
    // they touch no memory but the parameter struct.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
        if nice >= 19 {
            // The idle class: the thread runs only on a CPU nothing else
            // wants, and any serving thread waking up preempts it at once.
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}
