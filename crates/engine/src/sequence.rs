//! One sequence being generated: its tokens, how far the KV cache has
//! computed them, its blocks, and turning sampled tokens into events.
//!
//! A sequence's tokens are its prompt followed by what it generated so far.
//! `computed` counts the leading tokens whose keys and values are in its
//! blocks. Whenever `computed` catches up with the tokens, the logits of the
//! last step give the next token. Prefill and decode are the same thing
//! seen this way (a decode is a chunk of one token), and so is recompute
//! after preemption: the table is emptied, `computed` drops to zero and the
//! sequence runs its prompt plus generated tokens again, without emitting
//! anything until a new token is sampled.

use hearth_core::{
    EngineError, FinishReason, GenerateRequest, Priority, TokenCandidate, TokenEvent,
    TokenLogprobs, Usage,
};
use std::sync::Arc;

use hearth_models::LoraAdapter;
use tokenizers::Tokenizer;
use tokio::sync::mpsc;

use crate::adapters::{adapter_salt, scope_salt};
use crate::block_manager::{block_hashes, BlockTable};
use crate::detok::{token_bytes, IncrementalDecoder};
use crate::engine::EngineParts;
use crate::sampler::{Sampled, Sampler};
use crate::stop::{StopMatcher, StopOutcome};
use hearth_core::ConstraintState;

pub(crate) struct Sequence {
    pub(crate) request: GenerateRequest,
    /// The LoRA adapter it runs with, kept through preemption.
    pub(crate) adapter: Option<Arc<LoraAdapter>>,
    pub(crate) events: mpsc::UnboundedSender<TokenEvent>,
    /// Prompt then generated tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Leading tokens whose keys/values are in `table`.
    pub(crate) computed: usize,
    /// Prompt tokens the prefix cache held at the first scheduling.
    cached_prompt: Option<usize>,
    pub(crate) table: BlockTable,
    /// Prefix hash of every full block of `tokens`.
    hashes: Vec<u64>,
    salt: u64,
    /// Admission order (older first); kept across preemption.
    pub(crate) order: u64,
    /// Still counted among the engine's waiting requests.
    pub(crate) counted_waiting: bool,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Most tokens to generate (never past the context).
    max_new: usize,
    /// The request's grammar, at this sequence's position.
    constraint: Option<Box<dyn ConstraintState>>,
    /// Logits with the grammar's mask applied (reused between steps).
    masked: Vec<f32>,
    /// Why the grammar failed, if it did (the sequence then ends).
    constraint_error: Option<String>,
    /// The first end-of-sequence token (what a failed grammar samples).
    eos: Option<u32>,
}

impl Sequence {
    pub(crate) fn new(
        parts: &EngineParts,
        request: GenerateRequest,
        adapter: Option<Arc<LoraAdapter>>,
        events: mpsc::UnboundedSender<TokenEvent>,
        table: BlockTable,
        context_length: usize,
        salt: u64,
    ) -> Self {
        let salt = scope_salt(
            adapter_salt(salt, request.adapter.as_deref()),
            request.cache_scope.as_deref(),
        );
        let params = &request.params;
        let room = context_length.saturating_sub(request.prompt_ids.len());
        let max_new = params.max_tokens.map_or(room, |m| m.min(room));
        let tokens = request.prompt_ids.clone();
        Self {
            hashes: block_hashes(salt, &tokens),
            salt,
            prompt_len: tokens.len(),
            tokens,
            computed: 0,
            cached_prompt: None,
            table,
            order: 0,
            counted_waiting: true,
            sampler: Sampler::new(params),
            decoder: IncrementalDecoder::new(parts.tokenizer.clone(), true),
            stop: StopMatcher::new(params.stop.clone()),
            max_new,
            constraint: request.constraint.as_ref().map(|c| c.start()),
            masked: Vec::new(),
            constraint_error: None,
            eos: parts.eos_ids.first().copied(),
            request,
            adapter,
            events,
        }
    }

    pub(crate) fn priority(&self) -> Priority {
        self.request.priority
    }

    /// Tokens still to run before the next token can be sampled.
    pub(crate) fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// A decode step (one token) rather than a prefill chunk.
    pub(crate) fn is_decoding(&self) -> bool {
        self.pending() == 1 && self.tokens.len() > self.prompt_len
    }

    /// Takes cached blocks for the leading full blocks of the tokens,
    /// always leaving at least one token to run (its logits are needed).
    pub(crate) fn take_cached_prefix(&mut self) {
        let max_blocks = (self.tokens.len() - 1) / hearth_models::BLOCK_SIZE;
        let n = self.table.take_cached_prefix(&self.hashes, max_blocks);
        self.computed = n * hearth_models::BLOCK_SIZE;
        // What the first scheduling found (a preempted sequence finds its
        // own blocks again later).
        if self.cached_prompt.is_none() {
            self.cached_prompt = Some(self.computed.min(self.prompt_len));
        }
    }

    /// Drops every block; the sequence will recompute its tokens.
    pub(crate) fn reset(&mut self) {
        self.table.clear();
        self.computed = 0;
    }

    /// Marks `n` more tokens computed and registers the blocks they filled.
    pub(crate) fn advance(&mut self, n: usize) {
        self.computed += n;
        self.table.register_full(self.computed, &self.hashes);
    }

    fn push_token(&mut self, id: u32) {
        self.tokens.push(id);
        let full = self.tokens.len() / hearth_models::BLOCK_SIZE;
        if full > self.hashes.len() {
            let prev = self.hashes.last().copied().unwrap_or(self.salt);
            let start = self.hashes.len() * hearth_models::BLOCK_SIZE;
            self.hashes.extend(block_hashes(
                prev,
                &self.tokens[start..full * hearth_models::BLOCK_SIZE],
            ));
        }
    }

    /// How the next token can be picked where the logits are (see
    /// [`crate::sampler::Sampler::device_pick`]); never under a grammar.
    pub(crate) fn device_pick(&mut self) -> Option<hearth_models::Pick> {
        if self.constraint.is_some() {
            return None;
        }
        self.sampler.device_pick()
    }

    /// Samples the next token from `logits` (the sequence is unchanged
    /// until [`Sequence::emit`]); sequences sample independently, so a batch
    /// samples in parallel.
    pub(crate) fn sample(&mut self, logits: &[f32]) -> Sampled {
        let (prompt, generated) = self.tokens.split_at(self.prompt_len);
        let Some(constraint) = self.constraint.as_mut() else {
            return self.sampler.sample(logits, prompt, generated);
        };
        // Only the tokens the grammar allows keep their logits; the
        // distribution (and its log-probabilities) is the masked one.
        let mask = match constraint.allowed() {
            Ok(mask) => mask,
            Err(e) => {
                self.constraint_error = Some(e);
                Vec::new()
            }
        };
        self.masked.clear();
        self.masked.extend(logits.iter().enumerate().map(|(i, &l)| {
            if hearth_core::is_allowed(&mask, i as u32) {
                l
            } else {
                f32::NEG_INFINITY
            }
        }));
        if self.masked.iter().all(|l| *l == f32::NEG_INFINITY) {
            // Nothing allowed (the grammar failed): the first end-of-sequence
            // token ends the sequence.
            if let Some(eos) = self.eos {
                if let Some(l) = self.masked.get_mut(eos as usize) {
                    *l = 0.0;
                }
            }
        }
        self.sampler.sample(&self.masked, prompt, generated)
    }

    /// Appends a token from [`Sequence::sample`] and sends it. Returns true
    /// when the sequence is finished (or its client has gone).
    pub(crate) fn emit(&mut self, parts: &EngineParts, sampled: Sampled) -> bool {
        if self.constraint_error.is_some() {
            // The mask failed: the token is not one the grammar allowed.
            return self.grammar_failed();
        }
        self.push_token(sampled.id);
        let usage = Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.tokens.len() - self.prompt_len,
            cached_tokens: self.cached_prompt.unwrap_or(0),
        };
        let is_eos = parts.eos_ids.contains(&sampled.id);
        if is_eos && (!self.request.params.ignore_eos || self.constraint.is_some()) {
            return self.finish(FinishReason::Stop, usage);
        }
        let mut grammar_done = false;
        if let Some(constraint) = self.constraint.as_mut() {
            if let Err(e) = constraint.accept(sampled.id) {
                self.constraint_error = Some(e);
                return self.grammar_failed();
            }
            grammar_done = constraint.is_finished();
        }
        let logprobs = self
            .request
            .params
            .logprobs
            .map(|_| logprobs_of(&parts.tokenizer, &sampled));
        let piece = self.decoder.push(sampled.id);
        let (text, stopped) = match self.stop.push(&piece) {
            StopOutcome::Continue(text) => (text, false),
            StopOutcome::Stopped(text) => (text, true),
        };
        let sent = self.events.send(TokenEvent::Token {
            id: sampled.id,
            text,
            logprobs,
        });
        if sent.is_err() {
            return true;
        }
        if stopped {
            let _ = self.events.send(TokenEvent::Finished {
                reason: FinishReason::Stop,
                usage,
                text: String::new(),
            });
            return true;
        }
        if grammar_done {
            return self.finish(FinishReason::Stop, usage);
        }
        if usage.completion_tokens >= self.max_new {
            return self.finish(FinishReason::Length, usage);
        }
        false
    }

    /// Ends the sequence, releasing text still held back by the decoder or
    /// the stop matcher.
    /// Ends the sequence with the grammar engine's failure (a grammar too
    /// large for its limits, found mid-generation): an error naming the
    /// field the grammar came from, rather than output that breaks it.
    fn grammar_failed(&mut self) -> bool {
        let e = self.constraint_error.take().unwrap_or_default();
        tracing::warn!(request = %self.request.id, "structured output: {e}");
        let field = self
            .request
            .constraint
            .as_ref()
            .map_or("response_format", |c| c.field())
            .to_string();
        let generated = self.tokens.len() - self.prompt_len;
        let _ = self
            .events
            .send(TokenEvent::Error(EngineError::InvalidParameter {
                param: field,
                message: format!(
                    "the grammar engine gave up after {generated} output tokens ({e}); \
                 simplify the schema or grammar"
                ),
            }));
        true
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> bool {
        let tail = self.decoder.finish();
        let (text, reason) = match self.stop.push(&tail) {
            StopOutcome::Continue(mut text) => {
                text.push_str(&self.stop.flush());
                (text, reason)
            }
            StopOutcome::Stopped(text) => (text, FinishReason::Stop),
        };
        let _ = self.events.send(TokenEvent::Finished {
            reason,
            usage,
            text,
        });
        true
    }
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
        chosen: candidate(tokenizer, sampled.id, sampled.logprob.unwrap_or(f32::NAN)),
        top: sampled
            .top
            .iter()
            .map(|&(id, lp)| candidate(tokenizer, id, lp))
            .collect(),
    }
}
