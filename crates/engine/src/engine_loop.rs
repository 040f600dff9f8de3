//! The engine loop: continuous batching over one model.
//!
//! Each step the loop admits waiting requests (up to `max_active` sequences),
//! then builds one batch: every decoding sequence contributes its last sampled
//! token, and prefilling sequences share what is left of the step's token
//! budget (`max_batch_tokens`), so a long prompt is split over several steps
//! and never stalls running streams. The whole batch runs in one
//! [`CausalLM::forward_batch`]; sequences whose prompt is complete then sample
//! their next token. A sequence whose receiver was dropped (the client left)
//! is freed at the next step.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hearth_core::{
    EngineError, FinishReason, GenerateRequest, TokenCandidate, TokenEvent, TokenLogprobs, Usage,
};
use hearth_models::{KvCache, SeqStep};
use tokenizers::Tokenizer;
use tokio::sync::mpsc;

use crate::detok::{token_bytes, IncrementalDecoder};
use crate::engine::{EngineConfig, EngineParts, Job};
use crate::sampler::{Sampled, Sampler};
use crate::stop::{StopMatcher, StopOutcome};

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
    /// Most tokens to generate (never past the context).
    max_new: usize,
}

impl Sequence {
    fn prompt_len(&self) -> usize {
        self.request.prompt_ids.len()
    }
}

/// The tokens a sequence runs this step, within `budget`: the next prompt
/// chunk, or the last sampled token (not yet in the cache).
fn next_input<'a>(
    prompt: &'a [u32],
    prefilled: usize,
    generated: &'a [u32],
    budget: usize,
) -> &'a [u32] {
    if prefilled < prompt.len() {
        &prompt[prefilled..(prefilled + budget).min(prompt.len())]
    } else {
        &generated[generated.len().saturating_sub(1)..]
    }
}

pub(crate) struct EngineLoop {
    parts: EngineParts,
    config: EngineConfig,
    rx: mpsc::Receiver<Job>,
    active: Vec<Sequence>,
    context_length: usize,
    gauge: Arc<AtomicUsize>,
}

impl EngineLoop {
    pub(crate) fn new(
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

    pub(crate) fn run(mut self) {
        loop {
            self.active.retain(|s| !s.events.is_closed());
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
            if !job.events.is_closed() {
                let seq = self.new_sequence(job);
                self.active.push(seq);
            }
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
            max_new,
            request: job.request,
            events: job.events,
        }
    }

    /// Chooses this step's inputs: decodes first (one token each), then
    /// prefill chunks in admission order while the budget lasts.
    fn plan(&self) -> Vec<(usize, usize)> {
        let mut budget = self.config.max_batch_tokens.max(1);
        let mut plan = Vec::new();
        for (i, seq) in self.active.iter().enumerate() {
            if seq.prefilled >= seq.prompt_len() && budget > 0 {
                plan.push((i, 1));
                budget -= 1;
            }
        }
        for (i, seq) in self.active.iter().enumerate() {
            if seq.prefilled < seq.prompt_len() && budget > 0 {
                let n = (seq.prompt_len() - seq.prefilled).min(budget);
                plan.push((i, n));
                budget -= n;
            }
        }
        plan.sort_unstable();
        plan
    }

    fn step(&mut self) {
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        let logits = self.forward(&plan);
        let mut done = Vec::new();
        for (row, &(i, n)) in plan.iter().enumerate() {
            let seq = &mut self.active[i];
            let outcome = match &logits {
                Ok(rows) => {
                    if seq.prefilled < seq.prompt_len() {
                        seq.prefilled += n;
                    }
                    if seq.prefilled < seq.prompt_len() {
                        continue;
                    }
                    emit_next(&self.parts, seq, &rows[row])
                }
                Err(message) => {
                    tracing::error!(request = %seq.request.id, "{message}");
                    let _ = seq
                        .events
                        .send(TokenEvent::Error(EngineError::Model(message.clone())));
                    true
                }
            };
            if outcome {
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            self.active.swap_remove(i);
        }
    }

    /// One forward over the planned inputs; logits per planned row.
    fn forward(&mut self, plan: &[(usize, usize)]) -> Result<Vec<Vec<f32>>, String> {
        let model = &self.parts.model;
        let mut steps: Vec<SeqStep<'_>> = Vec::with_capacity(plan.len());
        let mut rest: &mut [Sequence] = &mut self.active;
        let mut offset = 0;
        for &(i, n) in plan {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(i - offset + 1);
            let seq = head
                .last_mut()
                .expect("plan indices are in range and sorted");
            rest = tail;
            offset = i + 1;
            let Sequence {
                request,
                prefilled,
                generated,
                cache,
                ..
            } = seq;
            steps.push(SeqStep {
                tokens: next_input(&request.prompt_ids, *prefilled, generated, n),
                cache,
            });
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            model
                .forward_batch(&mut steps)
                .and_then(|t| t.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>())
        }));
        match result {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!("engine panic: {}", panic_message(&panic))),
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

/// Samples the next token from `logits` and sends it. Returns true when the
/// sequence is finished (or its client has gone).
fn emit_next(parts: &EngineParts, seq: &mut Sequence, logits: &[f32]) -> bool {
    let sampled = seq
        .sampler
        .sample(logits, &seq.request.prompt_ids, &seq.generated);
    seq.generated.push(sampled.id);
    let usage = Usage {
        prompt_tokens: seq.prompt_len(),
        completion_tokens: seq.generated.len(),
    };
    if !seq.request.params.ignore_eos && parts.eos_ids.contains(&sampled.id) {
        return finish(seq, FinishReason::Stop, usage);
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
    let sent = seq.events.send(TokenEvent::Token {
        id: sampled.id,
        text,
        logprobs,
    });
    if sent.is_err() {
        return true;
    }
    if stopped {
        let _ = seq.events.send(TokenEvent::Finished {
            reason: FinishReason::Stop,
            usage,
            text: String::new(),
        });
        return true;
    }
    if seq.generated.len() >= seq.max_new {
        return finish(seq, FinishReason::Length, usage);
    }
    false
}

/// Ends a sequence, releasing text still held back by the decoder or the stop matcher.
fn finish(seq: &mut Sequence, reason: FinishReason, usage: Usage) -> bool {
    let tail = seq.decoder.finish();
    let (text, reason) = match seq.stop.push(&tail) {
        StopOutcome::Continue(mut text) => {
            text.push_str(&seq.stop.flush());
            (text, reason)
        }
        StopOutcome::Stopped(text) => (text, FinishReason::Stop),
    };
    let _ = seq.events.send(TokenEvent::Finished {
        reason,
        usage,
        text,
    });
    true
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
