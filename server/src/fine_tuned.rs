//! Fine-tuned models: the [`AdapterSource`] that serves succeeded jobs'
//! adapters (and imported ones, `crate::imported_adapters`) from the store,
//! and the start of this node's fine-tuning worker.
//!
//! A succeeded job's model is named `BASE:suffix:ftjob-...` (see
//! [`hearth_jobs::fine_tuned_model_name`]); a checkpoint's
//! `BASE:suffix:ftjob-...:ckpt-step-N`; an imported adapter's
//! `BASE:name:adapter-...`. All resolve only for their own project, to the
//! PEFT files in the blob store; the base's engine loads them once into its
//! adapter cache.

use std::collections::BTreeMap;
use std::path::PathBuf;

use hearth_api::ApiError;
use hearth_engine::adapters::LoadFuture;
use hearth_engine::catalog::{CatalogEntry, WeightFormat};
use hearth_engine::{AdapterLoader, PeftFiles};
use hearth_jobs::worker::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use hearth_jobs::{BaseModel, Worker, WorkerConfig, WorkerHandle};
use hearth_store::fine_tuning::{FtCheckpoint, FtJob};
use hearth_store::Store;

use crate::config::FineTuneArgs;
use crate::models_resolve::{AdapterModel, AdapterSource, SourceFuture};

/// Serves succeeded fine-tuning jobs (and their checkpoints) as models.
pub struct FineTunedModels {
    pub store: Store,
}

/// A loader of the PEFT files under a blob prefix (a checkpoint's, or an
/// imported adapter's).
pub(crate) fn blob_loader(store: Store, prefix: String) -> AdapterLoader {
    std::sync::Arc::new(move || -> LoadFuture {
        let (store, prefix) = (store.clone(), prefix.clone());
        Box::pin(async move {
            let weights = store
                .blobs()
                .get(&format!("{prefix}/{ADAPTER_WEIGHTS}"))
                .await?;
            let config = store
                .blobs()
                .get(&format!("{prefix}/{ADAPTER_CONFIG}"))
                .await?;
            Ok(PeftFiles {
                weights,
                config: String::from_utf8(config)?,
            })
        })
    })
}

fn adapter_model(store: &Store, job: &FtJob, name: String, ckpt: &FtCheckpoint) -> AdapterModel {
    AdapterModel {
        id: name,
        base: job.model.clone(),
        owned_by: job.project_id.clone(),
        created: job.finished_at.unwrap_or(ckpt.created_at).max(0) as u64,
        description: Some(format!(
            "LoRA fine-tune of {} (job {}, step {})",
            job.model, job.id, ckpt.step_number
        )),
        loader: blob_loader(store.clone(), ckpt.blob_prefix.clone()),
    }
}

fn internal(e: hearth_store::StoreError) -> ApiError {
    tracing::error!("fine-tuned model lookup failed: {e}");
    ApiError::internal()
}

impl FineTunedModels {
    async fn lookup(&self, project: &str, name: &str) -> Result<Option<AdapterModel>, ApiError> {
        if !name.contains(":ftjob-") {
            return crate::imported_adapters::resolve(&self.store, project, name).await;
        }
        // `NAME:ckpt-step-N` names a checkpoint of job model NAME.
        let (model, step) = match name.rsplit_once(":ckpt-step-") {
            Some((model, step)) => match step.parse::<i64>() {
                Ok(step) => (model, Some(step)),
                Err(_) => return Ok(None),
            },
            None => (name, None),
        };
        let Some(job) = self
            .store
            .ft_job_by_model(project, model)
            .await
            .map_err(internal)?
        else {
            return Ok(None);
        };
        let ckpt = match step {
            None => self
                .store
                .latest_ft_checkpoint(&job.id)
                .await
                .map_err(internal)?,
            Some(step) => {
                let (all, _) = self
                    .store
                    .list_ft_checkpoints(&job.id, 1000, None)
                    .await
                    .map_err(internal)?;
                all.into_iter().find(|c| c.step_number == step)
            }
        };
        Ok(ckpt.map(|c| adapter_model(&self.store, &job, name.to_string(), &c)))
    }
}

impl AdapterSource for FineTunedModels {
    fn resolve<'a>(
        &'a self,
        project: &'a str,
        name: &'a str,
    ) -> SourceFuture<'a, Result<Option<AdapterModel>, ApiError>> {
        Box::pin(self.lookup(project, name))
    }

    fn list<'a>(
        &'a self,
        project: &'a str,
    ) -> SourceFuture<'a, Result<Vec<AdapterModel>, ApiError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for job in self
                .store
                .succeeded_ft_jobs(project)
                .await
                .map_err(internal)?
            {
                let Some(name) = job.fine_tuned_model.clone() else {
                    continue;
                };
                if let Some(c) = self
                    .store
                    .latest_ft_checkpoint(&job.id)
                    .await
                    .map_err(internal)?
                {
                    out.push(adapter_model(&self.store, &job, name, &c));
                }
            }
            out.extend(crate::imported_adapters::list(&self.store, project).await?);
            Ok(out)
        })
    }
}

/// The trainable bases among the served chat models: GGUF or safetensors
/// Llama models, by catalogue id.
pub fn trainable_bases(entries: &[(CatalogEntry, PathBuf)]) -> BTreeMap<String, BaseModel> {
    entries
        .iter()
        .map(|(e, path)| {
            let base = match e.format {
                WeightFormat::Gguf => BaseModel::Gguf(path.clone()),
                WeightFormat::Safetensors => BaseModel::Safetensors(path.clone()),
            };
            (e.id.clone(), base)
        })
        .collect()
}

/// Starts this node's worker on the current runtime (none when
/// `--ft-jobs 0`). Between steps, training yields while any of `chat`'s
/// engines has requests running or waiting. Shut the handle down when the
/// server stops in good order: its jobs go back to the queue.
pub fn start_worker(
    store: Store,
    bases: BTreeMap<String, BaseModel>,
    chat: std::sync::Arc<BTreeMap<String, hearth_engine::ChatModel>>,
    args: &FineTuneArgs,
    node: &crate::nodes::NodeIdentity,
) -> Option<WorkerHandle> {
    if args.ft_jobs == 0 {
        tracing::info!("no fine-tuning worker on this node (--ft-jobs 0)");
        return None;
    }
    let config = WorkerConfig {
        // Claims carry the node's id; a node silent for the node timeout
        // loses its jobs to the others.
        worker_id: node.worker_id(),
        stale_after_secs: node.timeout_secs,
        max_jobs: args.ft_jobs,
        threads: args.ft_threads.max(1),
        checkpoint_every: args.ft_checkpoint_steps.max(1),
        checkpoint_interval: std::time::Duration::from_secs_f64(
            (args.ft_checkpoint_minutes * 60.0).clamp(1.0, 86_400.0),
        ),
        max_attempts: args.ft_max_attempts,
        nice: args.ft_nice.clamp(0, 19),
        serving_busy: Some(std::sync::Arc::new(move || {
            chat.values().any(|m| {
                let s = m.engine.snapshot();
                s.active > 0 || s.waiting > 0
            })
        })),
        yield_max: std::time::Duration::from_secs(args.ft_yield_max_secs),
        ..WorkerConfig::default()
    };
    tracing::info!(
        worker = %config.worker_id,
        jobs = config.max_jobs,
        threads = config.threads,
        "fine-tuning worker started"
    );
    Some(Worker::new(store, bases, config).spawn())
}
