//! The handle the server talks to the engine through.
//!
//! The engine loop ([`crate::engine_loop`]) runs on its own OS thread and owns
//! the model and the paged KV pool. Handlers call [`EngineHandle::submit`],
//! which checks the request against the model, counts it against the
//! waiting limit (a full queue is refused at once) and returns the
//! sequence's stream of [`TokenEvent`]s.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hearth_core::{EngineError, GenerateRequest, TokenEvent};
use hearth_models::{CausalLM, LoraAdapter, BLOCK_SIZE};
use tokenizers::Tokenizer;
use tokio::sync::mpsc;

use crate::adapters::{AdapterCache, LoadedAdapter};

/// Tunables of one engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests that may wait for a slot before new ones are refused.
    pub max_waiting: usize,
    /// Sequences advanced together.
    pub max_active: usize,
    /// Most tokens run in one step, over all sequences: decoding sequences
    /// take one each, prefills share the rest (a long prompt is split).
    pub max_batch_tokens: usize,
    /// Bytes of the KV pool; `None` picks [`default_kv_cache_bytes`]. The
    /// pool always holds at least one full context.
    pub kv_cache_bytes: Option<usize>,
    /// On a GPU, without `kv_cache_bytes`: the share of the device's memory
    /// that weights and the KV pool may take together (0.9 by default).
    pub gpu_memory_fraction: f64,
    /// LoRA adapters kept loaded ([`AdapterCache`] capacity).
    pub max_adapters: usize,
    /// Time a step may spend on batch-class sequences: they get the tokens
    /// that fit in it at the measured cost of a token (and none in a step
    /// that computes an interactive prompt). An interactive request waits
    /// at most about this long behind batch work.
    pub batch_step_time: Duration,
    /// After this long without interactive work, batch steps may take 25
    /// times `batch_step_time` (5 times after 2 s): a server busy with
    /// batches only runs them in full steps, while a client's next request
    /// within this time still waits behind a short step.
    pub batch_long_quiet: Duration,
    /// Threads of the engine's own pool; `None`: rayon's global pool,
    /// shared with the other models (see `threads.rs`).
    pub threads: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_waiting: 256,
            max_active: 64,
            max_batch_tokens: 512,
            kv_cache_bytes: None,
            gpu_memory_fraction: DEFAULT_GPU_MEMORY_FRACTION,
            max_adapters: crate::adapters::DEFAULT_MAX_ADAPTERS,
            batch_step_time: Duration::from_millis(20),
            batch_long_quiet: Duration::from_secs(10),
            threads: None,
        }
    }
}

/// Share of a GPU's memory that weights and the KV pool take together when
/// `--kv-cache-mb` is not given.
pub const DEFAULT_GPU_MEMORY_FRACTION: f64 = 0.9;

/// Default KV pool size for a model whose weights take `model_bytes`: the
/// larger of 256 MiB and twice the weights (room for many streams of a
/// small model, proportionate for a large one).
pub fn default_kv_cache_bytes(model_bytes: usize) -> usize {
    (256 << 20).max(2 * model_bytes)
}

/// Live counters of an engine, shared with its handles.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub(crate) active: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    pub(crate) blocks_in_use: AtomicUsize,
    pub(crate) blocks_total: AtomicUsize,
    pub(crate) preemptions: AtomicUsize,
    pub(crate) prefix_hit_blocks: AtomicUsize,
    /// Tokens run through the model (prompts, recompute included).
    pub(crate) prompt_tokens: AtomicUsize,
    /// Tokens sampled.
    pub(crate) generated_tokens: AtomicUsize,
    pub(crate) steps: AtomicUsize,
    /// Set when the engine loop stopped on a panic.
    pub(crate) dead: std::sync::atomic::AtomicBool,
}

/// A snapshot of an engine's counters (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    pub active: usize,
    pub waiting: usize,
    pub blocks_in_use: usize,
    pub blocks_total: usize,
    pub preemptions: usize,
    pub prefix_hit_blocks: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub steps: usize,
}

/// What the engine needs besides the model: the tokenizer and stop tokens.
pub struct EngineParts {
    pub model: Box<dyn CausalLM>,
    pub tokenizer: Arc<Tokenizer>,
    /// Token ids that end a sequence (unless `ignore_eos`).
    pub eos_ids: Vec<u32>,
    pub context_length: usize,
}

/// The receiving end of one sequence's events.
pub type TokenStream = mpsc::UnboundedReceiver<TokenEvent>;

pub(crate) struct Job {
    pub(crate) request: GenerateRequest,
    pub(crate) adapter: Option<Arc<LoraAdapter>>,
    pub(crate) events: mpsc::UnboundedSender<TokenEvent>,
}

/// What handles send the engine loop (a job moves once, so its size is
/// not worth a box).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Msg {
    Job(Job),
    /// End every sequence (`EngineError::Stopped`) and stop.
    Stop,
}

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Msg>,
    max_waiting: usize,
    context_length: usize,
    vocab_size: usize,
    block_bytes: usize,
    stats: Arc<EngineStats>,
    adapters: Arc<AdapterCache>,
}

impl EngineHandle {
    /// Starts the engine loop on its own thread. The thread ends by itself
    /// once every handle is dropped and its sequences are done. Fails when
    /// the KV pool cannot be created.
    pub fn start(parts: EngineParts, config: EngineConfig) -> candle_core::Result<Self> {
        let model = &parts.model;
        let block_bytes = model.block_bytes().max(1);
        let model_ctx = parts.context_length.min(model.info().context_length);
        let device = model.device();
        let bytes = crate::device::kv_cache_bytes(
            &device,
            config.kv_cache_bytes,
            config.gpu_memory_fraction,
        )
        .unwrap_or_else(|| default_kv_cache_bytes(0));
        // Always room for one sequence of the full context.
        let min_blocks = (model_ctx + 1).div_ceil(BLOCK_SIZE);
        let num_blocks = (bytes / block_bytes).max(min_blocks);
        let pool = model.new_pool(num_blocks)?;
        let context_length = model_ctx;
        tracing::info!(
            blocks = num_blocks,
            mib = pool.size_in_bytes() >> 20,
            tokens = num_blocks * BLOCK_SIZE,
            device = %crate::device::describe(&device),
            "kv cache pool"
        );
        let vocab_size = model.info().vocab_size;
        let adapters = Arc::new(AdapterCache::new(model.lora_spec(), config.max_adapters));
        let max_waiting = config.max_waiting;
        let stats = Arc::new(EngineStats::default());
        stats.blocks_total.store(num_blocks, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let loop_stats = stats.clone();
        let threads = config.threads;
        std::thread::Builder::new()
            .name("hearth-engine".into())
            .spawn(move || {
                crate::threads::run_on_pool(threads, "hearth-engine", move || {
                    crate::engine_loop::EngineLoop::new(
                        parts,
                        config,
                        rx,
                        pool,
                        context_length,
                        loop_stats,
                    )
                    .run()
                })
            })
            .map_err(candle_core::Error::wrap)?;
        Ok(Self {
            tx,
            max_waiting,
            context_length,
            vocab_size,
            block_bytes,
            stats,
            adapters,
        })
    }

    /// Stops the engine now: its running and waiting sequences end with
    /// [`EngineError::Stopped`], later requests are refused, and its
    /// thread frees the model and the KV pool without waiting for every
    /// handle to go.
    pub fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
    }

    /// The LoRA adapters of this engine's model: load one with
    /// [`AdapterCache::get`], then submit with [`EngineHandle::submit_with`].
    pub fn adapters(&self) -> &Arc<AdapterCache> {
        &self.adapters
    }

    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// Bytes of one KV block (16 tokens of every layer's keys and values).
    pub fn kv_block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Bytes of the KV pool an engine of this model needs at least: one
    /// sequence of the full context.
    pub fn min_kv_bytes(&self) -> usize {
        (self.context_length + 1).div_ceil(BLOCK_SIZE) * self.block_bytes
    }

    /// Sequences the engine is advancing now (not counting queued requests).
    pub fn active_sequences(&self) -> usize {
        self.stats.active.load(Ordering::Relaxed)
    }

    /// Requests queued, not yet admitted.
    pub fn waiting_requests(&self) -> usize {
        self.stats.waiting.load(Ordering::Relaxed)
    }

    /// KV blocks held by running sequences, and the pool's size.
    pub fn kv_blocks(&self) -> (usize, usize) {
        (
            self.stats.blocks_in_use.load(Ordering::Relaxed),
            self.stats.blocks_total.load(Ordering::Relaxed),
        )
    }

    /// Sequences preempted (freed and requeued for recompute) so far.
    pub fn preemptions(&self) -> usize {
        self.stats.preemptions.load(Ordering::Relaxed)
    }

    /// Prompt blocks served from the prefix cache so far.
    pub fn prefix_hit_blocks(&self) -> usize {
        self.stats.prefix_hit_blocks.load(Ordering::Relaxed)
    }

    /// All counters at once.
    /// Whether the engine loop still runs (false after a panic stopped it).
    pub fn is_alive(&self) -> bool {
        !self.stats.dead.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> EngineSnapshot {
        let s = &self.stats;
        let get = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        EngineSnapshot {
            active: get(&s.active),
            waiting: get(&s.waiting),
            blocks_in_use: get(&s.blocks_in_use),
            blocks_total: get(&s.blocks_total),
            preemptions: get(&s.preemptions),
            prefix_hit_blocks: get(&s.prefix_hit_blocks),
            prompt_tokens: get(&s.prompt_tokens),
            generated_tokens: get(&s.generated_tokens),
            steps: get(&s.steps),
        }
    }

    /// Checks a request against the model and queues it. Fails at once when
    /// `max_waiting` requests are already waiting or the request cannot run
    /// on this model. A request naming an adapter (`request.adapter`) needs
    /// it loaded in [`EngineHandle::adapters`] already.
    pub fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        let adapter = match request.adapter.as_deref() {
            None => None,
            Some(key) => {
                Some(
                    self.adapters
                        .peek(key)
                        .ok_or_else(|| EngineError::InvalidParameter {
                            param: "model".into(),
                            message: format!("the adapter {key} is not loaded"),
                        })?,
                )
            }
        };
        self.submit_with(request, adapter)
    }

    /// Queues a request to run with `adapter` (from [`AdapterCache::get`];
    /// `request.adapter` is set to its key) or on the base model (`None`:
    /// `request.adapter` is cleared).
    pub fn submit_with(
        &self,
        mut request: GenerateRequest,
        adapter: Option<LoadedAdapter>,
    ) -> Result<TokenStream, EngineError> {
        request.adapter = adapter.as_ref().map(|a| a.key.clone());
        let adapter = adapter.map(|a| a.adapter);
        self.check(&request)?;
        let waiting = &self.stats.waiting;
        if waiting.fetch_add(1, Ordering::Relaxed) >= self.max_waiting.max(1) {
            waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineError::Overloaded(self.max_waiting));
        }
        let (events, stream) = mpsc::unbounded_channel();
        let job = Job {
            request,
            adapter,
            events,
        };
        self.tx.send(Msg::Job(job)).map_err(|_| {
            waiting.fetch_sub(1, Ordering::Relaxed);
            EngineError::Stopped
        })?;
        Ok(stream)
    }

    fn check(&self, request: &GenerateRequest) -> Result<(), EngineError> {
        let prompt = &request.prompt_ids;
        if prompt.is_empty() {
            return Err(EngineError::InvalidParameter {
                param: "prompt".into(),
                message: "the prompt is empty".into(),
            });
        }
        if prompt.len() >= self.context_length {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: prompt.len(),
                context_length: self.context_length,
            });
        }
        if let Some(bad) = prompt.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(EngineError::InvalidParameter {
                param: "prompt".into(),
                message: format!(
                    "token id {bad} is outside the vocabulary of {} tokens",
                    self.vocab_size
                ),
            });
        }
        if let Some((bad, _)) = request
            .params
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= self.vocab_size)
        {
            return Err(EngineError::InvalidParameter {
                param: "logit_bias".into(),
                message: format!(
                    "token id {bad} is outside the vocabulary of {} tokens",
                    self.vocab_size
                ),
            });
        }
        Ok(())
    }
}
