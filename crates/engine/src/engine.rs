//! The handle the server talks to the engine through.
//!
//! The engine loop ([`crate::engine_loop`]) runs on its own OS thread and owns
//! the model and every sequence's KV cache. Handlers call
//! [`EngineHandle::submit`], which checks the request against the model, puts
//! it on a bounded queue (a full queue is refused at once) and returns the
//! sequence's stream of [`TokenEvent`]s.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hearth_core::{EngineError, GenerateRequest, TokenEvent};
use hearth_models::CausalLM;
use tokenizers::Tokenizer;
use tokio::sync::mpsc;

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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_waiting: 256,
            max_active: 8,
            max_batch_tokens: 512,
        }
    }
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
    pub(crate) events: mpsc::UnboundedSender<TokenEvent>,
}

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    max_waiting: usize,
    context_length: usize,
    vocab_size: usize,
    active: Arc<AtomicUsize>,
}

impl EngineHandle {
    /// Starts the engine loop on its own thread. The thread ends by itself
    /// once every handle is dropped and its sequences are done.
    pub fn start(parts: EngineParts, config: EngineConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.max_waiting.max(1));
        let context_length = parts.context_length.min(parts.model.info().context_length);
        let vocab_size = parts.model.info().vocab_size;
        let max_waiting = config.max_waiting;
        let active = Arc::new(AtomicUsize::new(0));
        let gauge = active.clone();
        std::thread::Builder::new()
            .name("hearth-engine".into())
            .spawn(move || crate::engine_loop::EngineLoop::new(parts, config, rx, gauge).run())
            .expect("spawning the engine thread");
        Self {
            tx,
            max_waiting,
            context_length,
            vocab_size,
            active,
        }
    }

    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// Sequences the engine is advancing now (not counting queued requests).
    pub fn active_sequences(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Requests queued, not yet admitted.
    pub fn waiting_requests(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Checks a request against the model and queues it. Fails at once when
    /// the queue is full or the request cannot run on this model.
    pub fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        self.check(&request)?;
        let (events, stream) = mpsc::unbounded_channel();
        self.tx
            .try_send(Job { request, events })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => EngineError::Overloaded(self.max_waiting),
                mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
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
