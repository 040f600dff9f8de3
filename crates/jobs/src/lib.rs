//! Hearth's background jobs: the LoRA trainer, the [`Worker`] that
//! claims fine-tuning jobs from the store and runs them (`worker.rs`), and
//! the [`BatchWorker`] that runs batches through the server's endpoints
//! (`batch/`).
//!
//! [`Trainer`] fine-tunes a LoRA adapter (PEFT's format, [`LoraAdapter`]) on
//! a frozen Llama base with a hand-written forward and backward,
//! synchronously, one optimizer step per [`Trainer::train_step`] call. The worker that claims jobs,
//! reports events, stores checkpoints and cancels lives on top of this API:
//!
//! ```no_run
//! # fn main() -> Result<(), hearth_jobs::TrainError> {
//! use hearth_jobs::{load_chat_parts, BaseModel, TrainConfig, Trainer};
//! let base = BaseModel::Gguf("model.gguf".into());
//! let parts = load_chat_parts(&base)?;
//! let text = std::fs::read_to_string("train.jsonl")?;
//! let data = hearth_api::training_data::parse_training_file(&text).map_err(hearth_jobs::TrainError::Data)?;
//! let mut t = Trainer::new(&base, "HuggingFaceTB/SmolLM2-135M-Instruct", &parts.tokenizer,
//!     &parts.template, &parts.eos_ids, &data, None, TrainConfig::default())?;
//! while t.step() < t.total_steps() {
//!     let report = t.train_step()?;           // event
//!     if report.epoch_end { let _checkpoint = t.save_state()?; }
//! }
//! t.adapter()?.save_dir("adapter/".as_ref())?;
//! # Ok(()) }
//! ```
//!
//! # Base model
//! - [`BaseModel::Gguf`]: every tensor is dequantised to f32
//!   (`QTensor::dequantize`). The q/k rows stay in GGUF's permuted layout and
//!   the forward uses GGML's interleaved RoPE; [`Trainer::adapter`] permutes
//!   the trained q/k `B` matrices back (`LoraAdapter::permuted_for_gguf(..,
//!   false)`), so adapters are always in Hugging Face / PEFT layout.
//! - [`BaseModel::Safetensors`]: a Hugging Face folder (`config.json`,
//!   `*.safetensors`), halves RoPE, no permutation.
//!
//! Biases, RoPE scaling other than linear (safetensors) and non-silu
//! activations are refused.
//!
//! # Training
//! - LoRA on q, k, v, o, gate, up and down of every layer:
//!   `y = W x + (alpha / r) B A dropout(x)`; `A` Kaiming-uniform (PEFT's
//!   `a = sqrt(5)`: uniform in `±1/sqrt(in)`), `B` zero, both held as candle
//!   `Var`s; only they get gradients.
//! - The step (`train/step.rs`) runs the forward and the backward written
//!   out by hand over the batch's real tokens (examples end to end, never
//!   padding), keeping per block only what its backward reads; attention
//!   is causal inside each example and recomputes its probabilities from a
//!   log-sum-exp; the output head runs only on rows that predict a loss
//!   token, 64 at a time, with the cross-entropy and its gradient fused.
//!   `train/model.rs` (candle autograd from primitives: RMSNorm, RoPE and
//!   softmax, since candle_nn's kernels for them have no backward) is the
//!   reference the tests hold the step to, and serves greedy generation.
//! - Data ([`train::data`]): chat examples are rendered with the model's
//!   chat template and the loss covers the trained assistant messages
//!   through their end-of-turn token; prompt/completion examples carry loss
//!   on the completion and EOS. Examples longer than `context_length` are
//!   truncated, examples left without loss tokens dropped; both are counted
//!   in [`DataStats`] ([`Trainer::data_stats`]).
//! - Batches: each optimizer step takes `batch_size` examples (the last
//!   batch of an epoch may be smaller), in an order shuffled per epoch with
//!   seed `seed + epoch`. The step lays the examples end to end with
//!   attention kept inside each, so `packing` (several examples in one
//!   padded row, as the reference forward lays them out) changes neither
//!   the loss nor the speed; it is kept as the API's hyperparameter.
//!   `total_steps = n_epochs * ceil(examples / batch_size)`.
//! - Loss: mean next-token cross-entropy over the step's loss tokens.
//! - Optimizer: AdamW (betas 0.9/0.999, eps 1e-8, decoupled weight decay on
//!   A and B), global-norm gradient clipping at `max_grad_norm` (0 = off),
//!   learning rate with linear warmup over `ceil(warmup_ratio * total)` steps
//!   then cosine (or linear) decay towards 0 ([`train::learning_rate`]).
//! - Dropout masks are seeded by `(seed, step, layer, target)`, the LoRA init
//!   by `seed`: the same seed and data give the same losses, and a run
//!   restored with [`Trainer::restore_state`] continues exactly as if never
//!   interrupted.
//! - Validation loss is computed at each epoch end when validation examples
//!   are given ([`StepReport::valid_loss`]).
//!
//! # Threads
//! Nothing here builds a thread pool: candle's CPU matmuls run on the rayon
//! pool current at the call, so a caller that runs `train_step` inside its
//! own `rayon::ThreadPool::install` keeps training off the global pool that
//! serving uses.

pub mod batch;
mod progress;
pub mod train;
pub mod worker;
mod worker_handle;

use std::path::PathBuf;

pub use batch::{BatchEndpoints, BatchWorker, BatchWorkerConfig, BatchWorkerHandle, EndpointReply};
pub use hearth_models::LoraAdapter;
pub use train::data::DataStats;
pub use train::model::TokenizedExample;
pub use train::trainer::Trainer;
pub use worker::{fine_tuned_model_name, Worker, WorkerConfig};
pub use worker_handle::WorkerHandle;

/// How the learning rate decays after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    #[default]
    Cosine,
    Linear,
}

/// Hyperparameters of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub n_epochs: usize,
    /// Examples per optimizer step.
    pub batch_size: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Fraction of the total steps spent warming up linearly.
    pub warmup_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip; 0 turns it off.
    pub max_grad_norm: f64,
    /// Packs examples into shared rows in the reference forward's layout;
    /// the step never computes padding either way (see the crate docs).
    pub packing: bool,
    /// Longest example in tokens (longer ones are truncated); at most the
    /// model's context length.
    pub context_length: usize,
    pub lora_r: usize,
    pub lora_alpha: f64,
    pub lora_dropout: f64,
    pub seed: u64,
    pub schedule: Schedule,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            n_epochs: 3,
            batch_size: 8,
            learning_rate: 1e-4,
            warmup_ratio: 0.0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            packing: false,
            context_length: 2048,
            lora_r: 8,
            lora_alpha: 16.0,
            lora_dropout: 0.0,
            seed: 0,
            schedule: Schedule::Cosine,
        }
    }
}

/// Where the frozen base model is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseModel {
    /// A llama GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face folder with `config.json` and `*.safetensors`.
    Safetensors(PathBuf),
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Steps done, this one included (1-based).
    pub step: usize,
    /// 0-based epoch of this step.
    pub epoch: usize,
    /// Mean loss over this step's loss tokens (before the update).
    pub train_loss: f32,
    /// Learning rate used for this step.
    pub learning_rate: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Loss tokens of this step.
    pub tokens: usize,
    /// Non-padding tokens run through forward + backward + update.
    pub real_tokens: usize,
    /// `real_tokens` per second of this step (validation excluded).
    pub tokens_per_second: f64,
    /// Mean validation loss, after the last step of an epoch when
    /// validation examples were given.
    pub valid_loss: Option<f32>,
    /// Whether this step ended an epoch.
    pub epoch_end: bool,
}

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("invalid training config: {0}")]
    Config(String),
    #[error("training data: {0}")]
    Data(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("base model: {0}")]
    Model(String),
    #[error("training state: {0}")]
    State(String),
    #[error("training is finished")]
    Finished,
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Tokenizer, chat template and end-of-sequence ids of a base model, built
/// exactly as the engine builds them (`hearth_engine::load`; the inference
/// model it also loads is dropped).
pub struct ChatParts {
    pub tokenizer: tokenizers::Tokenizer,
    pub template: hearth_engine::chat_template::ChatTemplate,
    pub eos_ids: Vec<u32>,
}

/// See [`ChatParts`].
pub fn load_chat_parts(base: &BaseModel) -> Result<ChatParts, TrainError> {
    let dev = candle_core::Device::Cpu;
    let lm = match base {
        BaseModel::Gguf(p) => hearth_engine::load::load_gguf(p, &dev),
        BaseModel::Safetensors(p) => hearth_engine::load::load_safetensors(p, &dev),
    }
    .map_err(|e| TrainError::Model(e.to_string()))?;
    Ok(ChatParts {
        tokenizer: lm.tokenizer,
        template: lm.template,
        eos_ids: lm.eos_ids,
    })
}
