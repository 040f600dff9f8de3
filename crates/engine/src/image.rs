//! Image models: a diffusers folder loaded into a
//! [`hearth_models::diffusion::DiffusionPipeline`] on a worker thread of its
//! own, behind a bounded queue.
//!
//! A generation takes seconds to minutes, so image requests never share a
//! thread with chat or embeddings: each image model has one OS thread that
//! runs one request at a time (its `n` images in one batched pass per
//! denoising step), and at most `max_waiting` more wait; beyond that a
//! request is refused at once ([`ImageError::QueueFull`], 529 at the edge).
//! A request whose caller went away (its future dropped) is skipped if it
//! has not started, and stopped between two denoising steps if it has.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use candle_core::{DType, Device};
use hearth_models::diffusion::DiffusionPipeline;
pub use hearth_models::diffusion::{ImageParams, RgbImage};
use tokio::sync::oneshot;

use crate::catalog::{CatalogEntry, ModelKind};

/// Limits of an image model's queue.
#[derive(Debug, Clone, Copy)]
pub struct ImageConfig {
    /// Requests that may wait behind the one running.
    pub max_waiting: usize,
    /// Most memory, in MiB, the largest attention of one UNet pass may
    /// hold ([`DiffusionPipeline::attention_bytes`]): it grows with the
    /// square of the image's area, so this bounds the sizes accepted.
    pub max_attention_mb: u64,
}

/// Default [`ImageConfig::max_attention_mb`]: 8 GiB, which lets the tiny
/// test pipeline make 1024x1024 and Stable Diffusion 1.x in f32 (8 heads)
/// 832x832; in f16 on a GPU, 1024x1024.
pub const DEFAULT_MAX_ATTENTION_MB: u64 = 8192;

impl Default for ImageConfig {
    fn default() -> Self {
        Self {
            max_waiting: 16,
            max_attention_mb: DEFAULT_MAX_ATTENTION_MB,
        }
    }
}

/// Why a generation produced no images.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("the image queue of `{0}` is full")]
    QueueFull(String),
    #[error("the generation was cancelled")]
    Cancelled,
    #[error("the image model stopped")]
    Stopped,
    #[error("the generation failed: {0}")]
    Failed(String),
}

/// Live counters of an image model (for `/metrics`).
#[derive(Debug, Default)]
pub struct ImageStats {
    running: AtomicUsize,
    steps: AtomicU64,
    images: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    /// Denoising steps of the running request: done and in all.
    step_done: AtomicUsize,
    step_total: AtomicUsize,
}

/// A snapshot of [`ImageStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSnapshot {
    pub waiting: usize,
    pub running: usize,
    pub steps_total: u64,
    pub images_total: u64,
    pub cancelled_total: u64,
    pub failed_total: u64,
    /// Progress of the running request: steps done of steps in all.
    pub progress: (usize, usize),
}

/// Requests admitted and not yet answered (the one running and those
/// waiting), against the limit: admission counts here rather than on the
/// channel's capacity, so that a request is never refused while the worker
/// is between two jobs.
struct Admission {
    outstanding: AtomicUsize,
    limit: usize,
}

struct Job {
    params: ImageParams,
    cancel: Arc<AtomicBool>,
    reply: oneshot::Sender<Result<Vec<RgbImage>, ImageError>>,
}

/// What the handlers need to serve an image model; cheap to clone.
#[derive(Clone)]
pub struct ImageModel {
    pub entry: CatalogEntry,
    pipeline: Arc<DiffusionPipeline>,
    tx: Sender<Job>,
    stats: Arc<ImageStats>,
    admission: Arc<Admission>,
    /// [`ImageConfig::max_attention_mb`].
    max_attention_mb: u64,
}

/// Sets the request's cancel flag when the waiting future is dropped (the
/// client went away) before the answer came.
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

impl ImageModel {
    /// Loads the catalogue entry's folder onto `device` (f32 on the CPU,
    /// f16 on a GPU) and starts its worker.
    pub fn start(
        entry: &CatalogEntry,
        models_dir: &Path,
        device: &Device,
        config: ImageConfig,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            entry.kind == ModelKind::Image,
            "model `{}` is not an image model",
            entry.id
        );
        let dtype = if device.is_cpu() {
            DType::F32
        } else {
            DType::F16
        };
        let pipeline = DiffusionPipeline::load(&entry.dir(models_dir), device, dtype)?;
        hearth_models::settle(device)?;
        Ok(Self::from_pipeline(entry.clone(), pipeline, config))
    }

    /// Serves an already loaded pipeline.
    pub fn from_pipeline(
        entry: CatalogEntry,
        pipeline: DiffusionPipeline,
        config: ImageConfig,
    ) -> Self {
        let pipeline = Arc::new(pipeline);
        let stats = Arc::new(ImageStats::default());
        let admission = Arc::new(Admission {
            outstanding: AtomicUsize::new(0),
            limit: config.max_waiting + 1,
        });
        let max_attention_mb = config.max_attention_mb;
        let (tx, rx) = channel();
        let (p, s, a) = (pipeline.clone(), stats.clone(), admission.clone());
        std::thread::Builder::new()
            .name(format!("hearth-image-{}", entry.id))
            .spawn(move || worker(&p, &s, &a, rx))
            .expect("spawning the image worker");
        Self {
            entry,
            pipeline,
            tx,
            stats,
            admission,
            max_attention_mb,
        }
    }

    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// `(width, height)` the model makes when a request says `auto`.
    pub fn default_size(&self) -> (usize, usize) {
        self.pipeline.default_size()
    }

    pub fn supports_size(&self, width: usize, height: usize) -> bool {
        self.pipeline.supports_size(width, height)
            && self.pipeline.attention_bytes(width, height) <= self.max_attention_mb << 20
    }

    /// The sizes the model accepts, in words.
    pub fn size_rule(&self) -> String {
        format!("{}; {}", self.pipeline.size_rule(), self.memory_rule())
    }

    /// Why the model cannot make `width` x `height`: the rule it breaks.
    pub fn size_refusal(&self, width: usize, height: usize) -> String {
        if self.pipeline.supports_size(width, height) {
            self.memory_rule()
        } else {
            self.pipeline.size_rule()
        }
    }

    fn memory_rule(&self) -> String {
        let m = self.pipeline.size_multiple();
        let side = (1..=4096 / m)
            .rev()
            .map(|k| k * m)
            .find(|&s| self.supports_size(s, s))
            .unwrap_or(0);
        format!(
            "its attention's memory, which grows with the square of the area, must \
             fit the server's --image-max-attention-mb {} (the largest square image \
             is {side}x{side})",
            self.max_attention_mb
        )
    }

    pub fn default_steps(&self) -> usize {
        self.pipeline.default_steps()
    }

    /// Classifier-free guidance when a request sets none: off (0) for
    /// few-step distilled models (a default of one step: SD-Turbo and the
    /// like are trained without it), else 7.5, the usual Stable Diffusion
    /// default.
    pub fn default_guidance_scale(&self) -> f64 {
        if self.default_steps() <= 4 {
            0.0
        } else {
            7.5
        }
    }

    /// Queues a generation and waits for its images. Refused at once when
    /// the queue is full; dropping the future cancels the request.
    pub async fn generate(&self, params: ImageParams) -> Result<Vec<RgbImage>, ImageError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let (reply, answer) = oneshot::channel();
        let job = Job {
            params,
            cancel: cancel.clone(),
            reply,
        };
        let a = &self.admission;
        if a.outstanding.fetch_add(1, Ordering::AcqRel) >= a.limit {
            a.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(ImageError::QueueFull(self.entry.id.clone()));
        }
        if self.tx.send(job).is_err() {
            a.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(ImageError::Stopped);
        }
        let mut guard = CancelOnDrop(cancel, false);
        let out = answer.await.unwrap_or(Err(ImageError::Stopped));
        guard.1 = true;
        out
    }

    pub fn snapshot(&self) -> ImageSnapshot {
        let s = &self.stats;
        let running = s.running.load(Ordering::Relaxed);
        ImageSnapshot {
            // Admitted and not answered, less the one running.
            waiting: self
                .admission
                .outstanding
                .load(Ordering::Relaxed)
                .saturating_sub(running),
            running,
            steps_total: s.steps.load(Ordering::Relaxed),
            images_total: s.images.load(Ordering::Relaxed),
            cancelled_total: s.cancelled.load(Ordering::Relaxed),
            failed_total: s.failed.load(Ordering::Relaxed),
            progress: (
                s.step_done.load(Ordering::Relaxed),
                s.step_total.load(Ordering::Relaxed),
            ),
        }
    }
}

/// Runs queued requests one at a time until every handle is gone.
fn worker(
    pipeline: &DiffusionPipeline,
    stats: &ImageStats,
    admission: &Admission,
    rx: Receiver<Job>,
) {
    for job in rx {
        if job.cancel.load(Ordering::Relaxed) || job.reply.is_closed() {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            admission.outstanding.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        stats.running.store(1, Ordering::Relaxed);
        stats.step_done.store(0, Ordering::Relaxed);
        let cancel = job.cancel.clone();
        let mut on_step = |done: usize, total: usize| {
            stats.steps.fetch_add(1, Ordering::Relaxed);
            stats.step_done.store(done, Ordering::Relaxed);
            stats.step_total.store(total, Ordering::Relaxed);
            !cancel.load(Ordering::Relaxed)
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pipeline.generate(&job.params, &mut on_step)
        }));
        let answer = match result {
            Ok(Ok(images)) => {
                stats
                    .images
                    .fetch_add(images.len() as u64, Ordering::Relaxed);
                Ok(images)
            }
            Ok(Err(_)) if job.cancel.load(Ordering::Relaxed) => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Err(ImageError::Cancelled)
            }
            Ok(Err(e)) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "image generation failed");
                Err(ImageError::Failed(e.to_string()))
            }
            Err(_) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!("image generation panicked");
                Err(ImageError::Failed("the model panicked".into()))
            }
        };
        stats.running.store(0, Ordering::Relaxed);
        stats.step_done.store(0, Ordering::Relaxed);
        stats.step_total.store(0, Ordering::Relaxed);
        admission.outstanding.fetch_sub(1, Ordering::AcqRel);
        let _ = job.reply.send(answer);
    }
}
