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
//! - Each job trains inside its own rayon pool of [`WorkerConfig::threads`]
//!   threads running at a lower CPU priority (`nice`), so interactive
//!   requests keep their latency: the serving threads win the CPU whenever
//!   they want it.
//! - Checkpoints (every [`WorkerConfig::checkpoint_every`] steps and at the
//!   end) are PEFT adapters plus the full training state in the blob store
//!   under `fine_tuning/<job>/step-<n>/`; a job claimed again after a crash
//!   resumes from its latest checkpoint.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hearth_api::fine_tuning::Hyperparameters;
use hearth_api::training_data::{parse_training_file, TrainingExample};
use hearth_store::fine_tuning::{FtJob, FtStatus};
use hearth_store::Store;
use serde_json::{json, Value};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use crate::{load_chat_parts, BaseModel, StepReport, TrainConfig, TrainError, Trainer};

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
    /// Steps between checkpoints (the last step always gets one).
    pub checkpoint_every: usize,
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
}

impl Worker {
    /// A worker training jobs whose `model` is a key of `bases` (the
    /// trainable models served by this node).
    pub fn new(store: Store, bases: BTreeMap<String, BaseModel>, config: WorkerConfig) -> Self {
        Self {
            store,
            bases: Arc::new(bases),
            config,
        }
    }

    /// Starts the claim loop on the current tokio runtime.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(self) {
        let slots = Arc::new(Semaphore::new(self.config.max_jobs.max(1)));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            match self
                .store
                .claim_ft_job(&self.config.worker_id, self.config.stale_after_secs)
                .await
            {
                Ok(Some(job)) => {
                    tracing::info!(job = %job.id, model = %job.model, "fine-tuning job claimed");
                    let ctx = JobContext {
                        store: self.store.clone(),
                        bases: self.bases.clone(),
                        config: self.config.clone(),
                        handle: Handle::current(),
                        cancelled: Arc::new(AtomicBool::new(false)),
                    };
                    tokio::spawn(async move {
                        ctx.run(job).await;
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

/// Why a job stopped without succeeding.
enum Stop {
    Cancelled,
    Failed { code: &'static str, message: String },
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
                let _ = store
                    .add_ft_event(
                        &job_id,
                        "error",
                        "message",
                        &format!("Training failed: {message}"),
                        None,
                    )
                    .await;
                let _ = store
                    .finish_ft_job(&job_id, FtStatus::Failed, None, &[], Some(error))
                    .await;
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
        pool.install(|| self.train(job))
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

    fn event(&self, job: &str, kind: &str, message: String, data: Option<Value>) {
        if let Err(e) = self.block_on(self.store.add_ft_event(job, "info", kind, &message, data)) {
            tracing::warn!(job, error = %e, "cannot record an event");
        }
    }

    fn read_dataset(
        &self,
        project_id: &str,
        file_id: &str,
        which: &str,
    ) -> Result<Vec<TrainingExample>, Stop> {
        let bytes = self.block_on(async {
            use futures_util::TryStreamExt;
            let file = self.store.file(project_id, file_id).await?;
            let chunks: Vec<bytes::Bytes> =
                self.store.file_content(&file).await?.try_collect().await?;
            Ok::<_, hearth_store::StoreError>(chunks.concat())
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
                        trainer.step()
                    ),
                    None,
                );
            }
            None => self.event(
                &job.id,
                "message",
                format!("Training started: {} examples, {total} steps", train.len()),
                None,
            ),
        }
        self.block_on(self.store.update_ft_progress(
            &job.id,
            trainer.step() as i64,
            trained_tokens,
            total as i64,
        ))?;
        let name = fine_tuned_model_name(&job);
        while trainer.step() < total {
            self.yield_to_serving();
            if self.cancelled.load(Ordering::SeqCst) {
                return Err(Stop::Cancelled);
            }
            let report = trainer.train_step()?;
            trained_tokens += report.tokens as i64;
            self.event(
                &job.id,
                "metrics",
                step_message(&report, total),
                Some(step_data(&report)),
            );
            self.block_on(self.store.update_ft_progress(
                &job.id,
                report.step as i64,
                trained_tokens,
                total as i64,
            ))?;
            let every = self.config.checkpoint_every.max(1);
            if report.step % every == 0 || report.step == total {
                self.checkpoint(&job, &trainer, &report, &name, trained_tokens)?;
            }
        }
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(Stop::Cancelled);
        }
        let csv = self.metrics_csv(&job.id)?;
        let file = self.block_on(self.store.create_file_from_bytes(
            &job.project_id,
            "step_metrics.csv",
            "fine-tune-results",
            csv.as_bytes(),
        ))?;
        let applied = self.block_on(self.store.finish_ft_job(
            &job.id,
            FtStatus::Succeeded,
            Some(&name),
            std::slice::from_ref(&file.id),
            None,
        ))?;
        if !applied {
            return Err(Stop::Cancelled);
        }
        self.event(
            &job.id,
            "message",
            format!("The job has successfully completed; the model {name} is ready"),
            None,
        );
        Ok(())
    }

    fn checkpoint(
        &self,
        job: &FtJob,
        trainer: &Trainer,
        report: &StepReport,
        name: &str,
        trained_tokens: i64,
    ) -> Result<(), Stop> {
        let prefix = format!("fine_tuning/{}/step-{:06}", job.id, report.step);
        let (weights, config) = trainer.adapter()?.to_peft()?;
        let state = trainer.save_state()?;
        let blobs = self.store.blobs();
        // The state goes last: a checkpoint row is only written once all
        // three blobs are in place.
        self.block_on(blobs.put(&format!("{prefix}/{ADAPTER_WEIGHTS}"), &weights))?;
        self.block_on(blobs.put(&format!("{prefix}/{ADAPTER_CONFIG}"), config.as_bytes()))?;
        self.block_on(blobs.put(&format!("{prefix}/{TRAINING_STATE}"), &state))?;
        let mut metrics = step_data(report);
        metrics["trained_tokens"] = json!(trained_tokens);
        self.block_on(self.store.add_ft_checkpoint(
            &job.id,
            report.step as i64,
            &format!("{name}:ckpt-step-{}", report.step),
            metrics,
            &prefix,
        ))?;
        self.event(
            &job.id,
            "message",
            format!("Checkpoint saved at step {}", report.step),
            None,
        );
        Ok(())
    }

    /// The training curve as CSV, from the metrics events (a step trained
    /// twice around a resume keeps its latest values).
    fn metrics_csv(&self, job_id: &str) -> Result<String, Stop> {
        let mut rows: BTreeMap<i64, Value> = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let (page, more) =
                self.block_on(self.store.list_ft_events(job_id, 1000, after.as_deref()))?;
            for e in &page {
                if e.kind == "metrics" {
                    if let Some(d) = &e.data {
                        let step = d["step"].as_i64().unwrap_or(0);
                        rows.entry(step).or_insert_with(|| d.clone());
                    }
                }
            }
            // Pages run newest first: the first value seen for a step is its latest.
            match (more, page.last()) {
                (true, Some(last)) => after = Some(last.id.clone()),
                _ => break,
            }
        }
        let mut csv = String::from("step,train_loss,valid_loss,learning_rate,tokens_per_second\n");
        let num = |v: &Value| v.as_f64().map(|x| x.to_string()).unwrap_or_default();
        for (step, d) in rows {
            csv.push_str(&format!(
                "{step},{},{},{},{}\n",
                num(&d["train_loss"]),
                num(&d["valid_loss"]),
                num(&d["learning_rate"]),
                num(&d["tokens_per_second"])
            ));
        }
        Ok(csv)
    }
}

fn step_message(r: &StepReport, total: usize) -> String {
    let mut m = format!("Step {}/{total}: training loss={:.4}", r.step, r.train_loss);
    if let Some(v) = r.valid_loss {
        m.push_str(&format!(", validation loss={v:.4}"));
    }
    m
}

fn step_data(r: &StepReport) -> Value {
    json!({
        "step": r.step,
        "epoch": r.epoch,
        "train_loss": r.train_loss,
        "valid_loss": r.valid_loss,
        "learning_rate": r.learning_rate,
        "tokens_per_second": r.tokens_per_second,
    })
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
