//! The engine loop and the handle the server talks to it through.
//!
//! The loop runs on its own OS thread and owns the model and every sequence's
//! KV cache. Handlers call [`EngineHandle::submit`], which puts the request on
//! a bounded queue (a full queue is refused at once) and returns a stream of
//! [`TokenEvent`]s. Each step the loop admits waiting requests up to
//! `max_active`, then advances every active sequence by one chunk of prefill
//! or one decoded token, so concurrent streams all make progress. A sequence
//! whose receiver was dropped (the client left) is freed at the next step.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use hearth_core::{
    EngineError, FinishReason, GenerateRequest, TokenCandidate, TokenEvent, TokenLogprobs, Usage,
};
use hearth_models::{CausalLM, KvCache};
use tokenizers::Tokenizer;
use tokio::sync::mpsc;

use crate::detok::{token_bytes, IncrementalDecoder};
use crate::sampler::{Sampled, Sampler};
use crate::stop::{StopMatcher, StopOutcome};

/// Tunables of one engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests that may wait for a slot before new ones are refused.
    pub max_waiting: usize,
    /// Sequences advanced together.
    pub max_active: usize,
    /// Most prompt tokens run in one forward (a long prompt is split).
    pub prefill_chunk: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_waiting: 256,
            max_active: 8,
            prefill_chunk: 512,
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

struct Job {
    request: GenerateRequest,
    events: mpsc::UnboundedSender<TokenEvent>,
}

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    max_waiting: usize,
    context_length: usize,
    vocab_size: usize,
    active: Arc<AtomicUsize>,
    _thread: Arc<ThreadGuard>,
}

struct ThreadGuard(Option<JoinHandle<()>>);

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        // The loop ends by itself once every sender is gone; don't block here.
        self.0.take();
    }
}

impl EngineHandle {
    /// Starts the engine loop on its own thread.
    pub fn start(parts: EngineParts, config: EngineConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.max_waiting.max(1));
        let context_length = parts.context_length.min(parts.model.info().context_length);
        let vocab_size = parts.model.info().vocab_size;
        let max_waiting = config.max_waiting;
        let active = Arc::new(AtomicUsize::new(0));
        let gauge = active.clone();
        let thread = std::thread::Builder::new()
            .name("hearth-engine".into())
            .spawn(move || EngineLoop::new(parts, config, rx, gauge).run())
            .expect("spawning the engine thread");
        Self {
            tx,
            max_waiting,
            context_length,
            vocab_size,
            active,
            _thread: Arc::new(ThreadGuard(Some(thread))),
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

/// One sequence being generated.
struct Sequence {
    request: GenerateRequest,
    events: mpsc::UnboundedSender<TokenEvent>,
    cache: KvCache,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Prompt tokens already run through the model.
    prefilled: usize,
    generated: Vec<u32>,
    /// Logits of the last position, waiting to be sampled.
    pending_logits: Option<Vec<f32>>,
    max_new: usize,
}

enum StepResult {
    Continue,
    Done,
}

struct EngineLoop {
    parts: EngineParts,
    config: EngineConfig,
    rx: mpsc::Receiver<Job>,
    active: Vec<Sequence>,
    context_length: usize,
    gauge: Arc<AtomicUsize>,
}

impl EngineLoop {
    fn new(
        parts: EngineParts,
        config: EngineConfig,
        rx: mpsc::Receiver<Job>,
        gauge: Arc<AtomicUsize>,
    ) -> Self {
        let context_length = parts.context_length.min(parts.model.info().context_length);
        Self {
            parts,
            config,
            rx,
            active: Vec::new(),
            context_length,
            gauge,
        }
    }

    fn run(mut self) {
        loop {
            self.gauge.store(self.active.len(), Ordering::Relaxed);
            if !self.admit() {
                return;
            }
            self.gauge.store(self.active.len(), Ordering::Relaxed);
            self.step();
        }
    }

    /// Takes waiting jobs while there is room. Blocks when idle. Returns
    /// false when the engine should stop (every handle dropped, nothing left).
    fn admit(&mut self) -> bool {
        while self.active.len() < self.config.max_active.max(1) {
            let job = if self.active.is_empty() {
                match self.rx.blocking_recv() {
                    Some(job) => job,
                    None => return false,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            if job.events.is_closed() {
                continue;
            }
            let seq = self.new_sequence(job);
            self.active.push(seq);
        }
        true
    }

    fn new_sequence(&self, job: Job) -> Sequence {
        let params = &job.request.params;
        let room = self.context_length - job.request.prompt_ids.len();
        let max_new = params.max_tokens.map_or(room, |m| m.min(room));
        Sequence {
            cache: self.parts.model.new_cache(),
            sampler: Sampler::new(params),
            decoder: IncrementalDecoder::new(self.parts.tokenizer.clone(), true),
            stop: StopMatcher::new(params.stop.clone()),
            prefilled: 0,
            generated: Vec::new(),
            pending_logits: None,
            max_new,
            request: job.request,
            events: job.events,
        }
    }

    fn step(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let seq = &mut self.active[i];
            let result = if seq.events.is_closed() {
                Ok(StepResult::Done)
            } else {
                let parts = &self.parts;
                let chunk = self.config.prefill_chunk.max(1);
                std::panic::catch_unwind(AssertUnwindSafe(|| advance(parts, chunk, seq)))
                    .unwrap_or_else(|panic| Err(format!("engine panic: {}", panic_message(&panic))))
            };
            match result {
                Ok(StepResult::Continue) => i += 1,
                Ok(StepResult::Done) => {
                    self.active.swap_remove(i);
                }
                Err(message) => {
                    tracing::error!(request = %seq.request.id, "{message}");
                    let _ = seq
                        .events
                        .send(TokenEvent::Error(EngineError::Model(message)));
                    self.active.swap_remove(i);
                }
            }
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown".to_string())
}

/// Runs one chunk of prefill, or samples one token and runs it.
fn advance(parts: &EngineParts, chunk: usize, seq: &mut Sequence) -> Result<StepResult, String> {
    let prompt_len = seq.request.prompt_ids.len();
    if seq.prefilled < prompt_len {
        let end = (seq.prefilled + chunk).min(prompt_len);
        let logits = forward(
            parts,
            &seq.request.prompt_ids[seq.prefilled..end],
            &mut seq.cache,
        )?;
        seq.prefilled = end;
        if end == prompt_len {
            seq.pending_logits = Some(logits);
        }
        return Ok(StepResult::Continue);
    }
    let logits = match seq.pending_logits.take() {
        Some(logits) => logits,
        None => return Err("sequence has no logits to sample from".into()),
    };
    let sampled = seq
        .sampler
        .sample(&logits, &seq.request.prompt_ids, &seq.generated);
    seq.generated.push(sampled.id);
    let usage = Usage {
        prompt_tokens: prompt_len,
        completion_tokens: seq.generated.len(),
    };
    let is_eos = !seq.request.params.ignore_eos && parts.eos_ids.contains(&sampled.id);
    if is_eos {
        return Ok(finish(seq, FinishReason::Stop, usage));
    }
    let logprobs = seq
        .request
        .params
        .logprobs
        .map(|_| logprobs_of(&parts.tokenizer, &sampled));
    let piece = seq.decoder.push(sampled.id);
    let (text, stopped) = match seq.stop.push(&piece) {
        StopOutcome::Continue(text) => (text, false),
        StopOutcome::Stopped(text) => (text, true),
    };
    if seq
        .events
        .send(TokenEvent::Token {
            id: sampled.id,
            text,
            logprobs,
        })
        .is_err()
    {
        return Ok(StepResult::Done);
    }
    if stopped {
        let _ = seq.events.send(TokenEvent::Finished {
            reason: FinishReason::Stop,
            usage,
            text: String::new(),
        });
        return Ok(StepResult::Done);
    }
    if seq.generated.len() >= seq.max_new {
        return Ok(finish(seq, FinishReason::Length, usage));
    }
    seq.pending_logits = Some(forward(parts, &[sampled.id], &mut seq.cache)?);
    Ok(StepResult::Continue)
}

/// Ends a sequence, releasing text still held back by the decoder or the stop matcher.
fn finish(seq: &mut Sequence, reason: FinishReason, usage: Usage) -> StepResult {
    let tail = seq.decoder.finish();
    let mut text = match seq.stop.push(&tail) {
        StopOutcome::Continue(text) => text,
        StopOutcome::Stopped(text) => {
            let _ = seq.events.send(TokenEvent::Finished {
                reason: FinishReason::Stop,
                usage,
                text,
            });
            return StepResult::Done;
        }
    };
    text.push_str(&seq.stop.flush());
    let _ = seq.events.send(TokenEvent::Finished {
        reason,
        usage,
        text,
    });
    StepResult::Done
}

fn forward(parts: &EngineParts, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>, String> {
    parts
        .model
        .forward(tokens, cache)
        .and_then(|t| t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>())
        .map_err(|e| e.to_string())
}

fn candidate(tokenizer: &Tokenizer, id: u32, logprob: f32) -> TokenCandidate {
    let bytes = token_bytes(tokenizer, id);
    TokenCandidate {
        id,
        text: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob,
    }
}

fn logprobs_of(tokenizer: &Tokenizer, sampled: &Sampled) -> TokenLogprobs {
    TokenLogprobs {
        chosen: candidate(tokenizer, sampled.id, sampled.logprob),
        top: sampled
            .top
            .iter()
            .map(|&(id, lp)| candidate(tokenizer, id, lp))
            .collect(),
    }
}
