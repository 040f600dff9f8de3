//! The engine loop: a continuous-batching scheduler over one model and one
//! paged KV pool.
//!
//! Every step:
//! 1. New requests are taken off the channel into the waiting queues (one
//!    per [`Priority`]); sequences whose client left, running or waiting,
//!    are dropped, which returns their blocks.
//! 2. Admission: waiting sequences join the running batch, interactive
//!    first, oldest first, while there are `max_active` slots and the pool
//!    has blocks for the whole prompt of the newcomer on top of what the
//!    running prefills still need. An interactive newcomer that finds no
//!    slot or no blocks evicts the newest batch-class sequence (recomputed
//!    later) instead of waiting behind batch work. A newcomer first takes the cached blocks
//!    of its prompt's prefix ([`crate::block_manager`]), which it does not
//!    recompute.
//! 3. Planning, within `max_batch_tokens`: every decoding sequence gets one
//!    token, then prefilling sequences get chunks of what is left, so a long
//!    prompt is split over steps and never stalls running streams. A
//!    decode that needs a new block when the pool is empty preempts the
//!    newest sequence of the lowest class (batch work before interactive;
//!    itself if it is that one): its blocks are freed and it goes back to the
//!    front of its queue to be recomputed later. Batch-class sequences get
//!    the tokens that fit in `batch_step_time` at the measured cost of a
//!    token ([`StepCost`]) while interactive work is about (`QUIET_FACTOR`
//!    times that on a server without any for 2 s, `LONG_QUIET_FACTOR`
//!    times after `batch_long_quiet`), and none in a step that
//!    computes an interactive prompt, so an interactive request's first
//!    token waits for at most one short step behind batch work, whatever
//!    the hardware.
//! 4. One [`hearth_models::CausalLM::forward_paged`] over every planned chunk; sequences
//!    whose tokens are all computed sample their next token and emit it.
//!
//! The plan is plain data (sequence, token count, block table); the model
//! never touches the block manager.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_core::{EngineError, Priority, TokenEvent};
use hearth_models::{pick_tokens, KvPool, PagedSeq, Pick};
use rayon::prelude::*;
use tokio::sync::mpsc;

use crate::block_manager::BlockManager;
use crate::engine::{EngineConfig, EngineParts, EngineStats, Job, Msg};
use crate::sampler::Sampled;
use crate::sequence::Sequence;
use crate::step_cost::StepCost;

const CLASSES: usize = 2;

/// Before any step was measured, batch-class sequences take at most
/// `1 / BATCH_STEP_SHARE` of a step's tokens.
const BATCH_STEP_SHARE: usize = 8;

/// How long after its last interactive sequence a server still holds
/// batch steps to `batch_step_time` (requests of a conversation or a
/// client's next call come within it).
const INTERACTIVE_LINGER: Duration = Duration::from_secs(2);

/// On a server without interactive work, batch steps may take this many
/// times `batch_step_time`.
const QUIET_FACTOR: u32 = 5;

/// After `EngineConfig::batch_long_quiet` without interactive work, batch
/// steps may take this many times `batch_step_time`: room for every
/// running batch sequence's token in one step on a slow CPU.
const LONG_QUIET_FACTOR: u32 = 25;

fn class(p: Priority) -> usize {
    match p {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

pub(crate) struct EngineLoop {
    parts: EngineParts,
    config: EngineConfig,
    rx: mpsc::UnboundedReceiver<Msg>,
    pool: KvPool,
    blocks: BlockManager,
    waiting: [VecDeque<Sequence>; CLASSES],
    /// Running sequences, sorted by (priority, admission order).
    active: Vec<Sequence>,
    next_order: u64,
    context_length: usize,
    salt: u64,
    stats: Arc<EngineStats>,
    cost: StepCost,
    /// When an interactive sequence was last running or waiting.
    last_interactive: Option<Instant>,
}

impl EngineLoop {
    pub(crate) fn new(
        parts: EngineParts,
        config: EngineConfig,
        rx: mpsc::UnboundedReceiver<Msg>,
        pool: KvPool,
        context_length: usize,
        stats: Arc<EngineStats>,
    ) -> Self {
        let blocks = BlockManager::new(pool.num_blocks());
        Self {
            parts,
            config,
            rx,
            pool,
            blocks,
            waiting: Default::default(),
            active: Vec::new(),
            next_order: 0,
            context_length,
            salt: 0x4845_4152_5448, // one model per engine; each adapter re-salts
            stats,
            cost: StepCost::default(),
            last_interactive: None,
        }
    }

    /// Serves until every handle is dropped. A panic anywhere in a turn
    /// (scheduling, the forward pass, sampling, emission) ends every
    /// sequence with an error and stops the engine, marked dead in its
    /// stats (health checks report it; new requests are refused).
    pub(crate) fn run(mut self) {
        loop {
            if !self.receive() {
                return;
            }
            let turn = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.drop_departed();
                self.admit();
                self.publish();
                self.step();
                self.publish();
            }));
            if let Err(panic) = turn {
                let message = format!("engine panic: {}", panic_message(&panic));
                tracing::error!("{message}; the engine stops");
                self.stats.dead.store(true, Ordering::Relaxed);
                self.fail_all(EngineError::Model(message));
                return;
            }
        }
    }

    /// Ends every running and waiting sequence with `error`.
    fn fail_all(&mut self, error: EngineError) {
        let waiting = self.waiting.iter_mut().flat_map(|q| q.drain(..));
        for seq in self.active.drain(..).chain(waiting) {
            let _ = seq.events.send(TokenEvent::Error(error.clone()));
        }
    }

    fn publish(&self) {
        let s = &self.stats;
        s.active.store(self.active.len(), Ordering::Relaxed);
        s.blocks_in_use
            .store(self.blocks.in_use(), Ordering::Relaxed);
        s.prefix_hit_blocks
            .store(self.blocks.prefix_hits() as usize, Ordering::Relaxed);
    }

    /// Moves new jobs into the waiting queues; blocks while there is nothing
    /// to do. Returns false when the engine should stop (every handle
    /// dropped, nothing left; or told to stop, every sequence ended).
    fn receive(&mut self) -> bool {
        let idle = self.active.is_empty() && self.waiting.iter().all(VecDeque::is_empty);
        if idle {
            match self.rx.blocking_recv() {
                Some(Msg::Job(job)) => self.enqueue(job),
                Some(Msg::Stop) | None => return false,
            }
        }
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Job(job) => self.enqueue(job),
                Msg::Stop => {
                    self.fail_all(EngineError::Stopped);
                    return false;
                }
            }
        }
        true
    }

    fn enqueue(&mut self, job: Job) {
        let seq = Sequence::new(
            &self.parts,
            job.request,
            job.adapter,
            job.events,
            self.blocks.table(),
            self.context_length,
            self.salt,
        );
        self.waiting[class(seq.priority())].push_back(seq);
    }

    fn uncount(&self, seq: &mut Sequence) {
        if std::mem::take(&mut seq.counted_waiting) {
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Frees the sequences whose client went away.
    fn drop_departed(&mut self) {
        self.active.retain(|s| !s.events.is_closed());
        for c in 0..CLASSES {
            let mut queue = std::mem::take(&mut self.waiting[c]);
            queue.retain_mut(|s| {
                let keep = !s.events.is_closed();
                if !keep {
                    self.uncount(s);
                }
                keep
            });
            self.waiting[c] = queue;
        }
    }

    /// Blocks the running sequences still need for the tokens they have.
    fn outstanding_blocks(&self) -> usize {
        self.active
            .iter()
            .map(|s| {
                s.tokens
                    .len()
                    .div_ceil(hearth_models::BLOCK_SIZE)
                    .saturating_sub(s.table.blocks().len())
            })
            .sum()
    }

    fn admit(&mut self) {
        loop {
            let interactive_waits = !self.waiting[0].is_empty();
            if self.active.len() >= self.config.max_active.max(1)
                && !(interactive_waits && self.evict_batch())
            {
                return;
            }
            let Some(c) = (0..CLASSES).find(|&c| !self.waiting[c].is_empty()) else {
                return;
            };
            let mut seq = self.waiting[c].pop_front().expect("non-empty queue");
            seq.take_cached_prefix();
            let need = (seq.tokens.len() + 1)
                .div_ceil(hearth_models::BLOCK_SIZE)
                .saturating_sub(seq.table.blocks().len());
            let fits = self.blocks.available() >= need + self.outstanding_blocks();
            if !fits && !self.active.is_empty() {
                seq.reset();
                self.waiting[c].push_front(seq);
                if c == 0 && self.evict_batch() {
                    continue;
                }
                return;
            }
            self.uncount(&mut seq);
            if seq.order == 0 {
                self.next_order += 1;
                seq.order = self.next_order;
            }
            let key = (seq.priority(), seq.order);
            let at = self
                .active
                .partition_point(|s| (s.priority(), s.order) < key);
            self.active.insert(at, seq);
        }
    }

    /// Makes room for interactive work: the newest running batch-class
    /// sequence frees its slot and blocks and goes back to the front of its
    /// queue (recomputed later, as a preempted one). False when none runs.
    fn evict_batch(&mut self) -> bool {
        if self
            .active
            .last()
            .is_none_or(|s| s.priority() != Priority::Batch)
        {
            return false;
        }
        let mut seq = self.active.pop().expect("a running sequence");
        seq.reset();
        self.waiting[class(Priority::Batch)].push_front(seq);
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The sequence to preempt so that `keep` can grow: the newest of the
    /// lowest class among `candidates`, never of a higher class than `keep`.
    fn victim(&self, keep: usize, candidates: impl Iterator<Item = usize>) -> Option<usize> {
        let floor = self.active[keep].priority();
        candidates
            .filter(|&i| i != keep && self.active[i].priority() >= floor)
            .max_by_key(|&i| (self.active[i].priority(), self.active[i].order))
    }

    /// Tokens batch-class sequences may run this step. None while an
    /// interactive prompt is computed (it runs alone); while interactive
    /// work runs or ran within `INTERACTIVE_LINGER`, what fits in
    /// `batch_step_time` at the measured cost per token, so an arriving
    /// request waits for at most one short step; on a server with no
    /// interactive work, `QUIET_FACTOR` times that, so batches run in
    /// the larger steps the hardware is faster with.
    fn batch_budget(&mut self, budget: usize) -> usize {
        let mut interactive = self
            .active
            .iter()
            .filter(|s| s.priority() == Priority::Interactive)
            .peekable();
        let present = interactive.peek().is_some() || !self.waiting[0].is_empty();
        if interactive.any(|s| !s.is_decoding()) {
            self.last_interactive = Some(Instant::now());
            return 0;
        }
        if present {
            self.last_interactive = Some(Instant::now());
        }
        let quiet_for = self.last_interactive.map(|t| t.elapsed());
        let time = match quiet_for {
            Some(d) if d < INTERACTIVE_LINGER => self.config.batch_step_time,
            Some(d) if d < self.config.batch_long_quiet => {
                self.config.batch_step_time * QUIET_FACTOR
            }
            _ => self.config.batch_step_time * LONG_QUIET_FACTOR,
        };
        self.cost
            .tokens_within(time, budget / BATCH_STEP_SHARE)
            .min(budget)
    }

    /// Chooses this step's chunks: `(index into active, tokens)`, sorted by
    /// index. Preempted sequences are moved back to their queues.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        let mut budget = self.config.max_batch_tokens.max(1);
        let mut batch_budget = self.batch_budget(budget);
        let mut planned: Vec<(usize, usize)> = Vec::new();
        let mut preempted = vec![false; self.active.len()];
        for decoding in [true, false] {
            for i in 0..self.active.len() {
                if budget == 0 {
                    break;
                }
                let s = &self.active[i];
                if preempted[i] || s.is_decoding() != decoding {
                    continue;
                }
                let is_batch = s.priority() == Priority::Batch;
                let cap = if is_batch { batch_budget } else { budget };
                let mut n = s.pending().min(cap);
                if n == 0 {
                    continue;
                }
                loop {
                    let s = &mut self.active[i];
                    if s.table.ensure(s.computed + n) {
                        break;
                    }
                    if !decoding {
                        // A prefill takes what fits, or waits.
                        let room = s.table.capacity() - s.computed
                            + self.blocks.available() * hearth_models::BLOCK_SIZE;
                        n = n.min(room);
                        if n > 0 && !s.table.ensure(s.computed + n) {
                            n = 0;
                        }
                        break;
                    }
                    let unplanned = (0..self.active.len())
                        .filter(|&j| !preempted[j] && !planned.iter().any(|p| p.0 == j));
                    let victim = self.victim(i, unplanned.collect::<Vec<_>>().into_iter());
                    let v = victim.unwrap_or(i);
                    self.active[v].reset();
                    preempted[v] = true;
                    self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
                    if v == i {
                        n = 0;
                        break;
                    }
                }
                if n > 0 {
                    planned.push((i, n));
                    budget -= n;
                    if is_batch {
                        batch_budget -= n;
                    }
                }
            }
        }
        // Return preempted sequences to the front of their queues (oldest
        // ends up first), then drop them from the running set.
        for i in (0..self.active.len()).rev() {
            if preempted[i] {
                let seq = self.active.remove(i);
                for p in planned.iter_mut() {
                    debug_assert_ne!(p.0, i, "a planned sequence was preempted");
                    if p.0 > i {
                        p.0 -= 1;
                    }
                }
                self.waiting[class(seq.priority())].push_front(seq);
            }
        }
        planned.sort_unstable();
        planned
    }

    fn step(&mut self) {
        let started = Instant::now();
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        let run: usize = plan.iter().map(|p| p.1).sum();
        self.run_step(&plan, run);
        self.cost.observe(run, started.elapsed());
    }

    /// Runs the planned chunks (`run` tokens in all): one forward, then
    /// sampling and emission for the sequences whose tokens are computed.
    fn run_step(&mut self, plan: &[(usize, usize)], run: usize) {
        let logits = self.forward(plan);
        let stats = &self.stats;
        stats.steps.fetch_add(1, Ordering::Relaxed);
        let decodes = plan
            .iter()
            .filter(|&&(i, _)| self.active[i].is_decoding())
            .count();
        stats
            .prompt_tokens
            .fetch_add(run - decodes, Ordering::Relaxed);
        let rows = match logits {
            Ok(rows) => rows,
            Err(message) => {
                // The batch failed: every sequence in it ends with the error.
                let mut failed: Vec<usize> = plan.iter().map(|p| p.0).collect();
                failed.sort_unstable();
                for &i in &failed {
                    let seq = &self.active[i];
                    tracing::error!(request = %seq.request.id, "{message}");
                    let _ = seq
                        .events
                        .send(TokenEvent::Error(EngineError::Model(message.clone())));
                }
                for i in failed.into_iter().rev() {
                    self.active.remove(i);
                }
                return;
            }
        };
        // Logits row of each sequence that samples this step (its prompt,
        // if any, is now fully computed).
        let mut row_of = vec![None; self.active.len()];
        for (row, &(i, n)) in plan.iter().enumerate() {
            let seq = &mut self.active[i];
            seq.advance(n);
            if seq.pending() == 0 {
                row_of[i] = Some(row);
            }
        }
        let sampling = row_of.iter().flatten().count();
        let sample = |(seq, row): (&mut Sequence, &Option<usize>)| {
            row.map(|r| match &rows {
                StepLogits::Rows(rows) => seq.sample(&rows[r]),
                // Picked on the device (`Sequence::device_pick`).
                StepLogits::Picked(ids) => Sampled {
                    id: ids[r],
                    logprob: None,
                    top: Vec::new(),
                },
            })
        };
        let samples: Vec<Option<Sampled>> = if sampling > 1 {
            self.active
                .par_iter_mut()
                .zip(&row_of)
                .map(sample)
                .collect()
        } else {
            self.active.iter_mut().zip(&row_of).map(sample).collect()
        };
        let mut done = Vec::new();
        for (i, sampled) in samples.into_iter().enumerate() {
            let Some(sampled) = sampled else { continue };
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
            if self.active[i].emit(&self.parts, sampled) {
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            self.active.remove(i);
        }
    }

    /// One forward over the planned chunks; logits per planned row, or
    /// only each row's token where the model runs on a GPU and every
    /// planned sequence can have it picked there (`Sequence::device_pick`:
    /// the argmax or a plain temperature draw; the logits then stay there).
    fn forward(&mut self, plan: &[(usize, usize)]) -> Result<StepLogits, String> {
        let picks: Option<Vec<Pick>> = if self.parts.model.device().is_cpu() {
            None
        } else {
            plan.iter()
                .map(|&(i, _)| self.active[i].device_pick())
                .collect()
        };
        let seqs: Vec<PagedSeq<'_>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.active[i];
                PagedSeq {
                    tokens: &s.tokens[s.computed..s.computed + n],
                    pos: s.computed,
                    blocks: s.table.blocks(),
                    lora: s.adapter.as_deref(),
                }
            })
            .collect();
        let model = &self.parts.model;
        let pool = &mut self.pool;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| -> candle_core::Result<_> {
            let logits = model.forward_paged(&seqs, pool)?;
            if let Some(picks) = &picks {
                return Ok(StepLogits::Picked(pick_tokens(&logits, picks)?));
            }
            let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
            Ok(StepLogits::Rows(rows))
        }));
        match result {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!("engine panic: {}", panic_message(&panic))),
        }
    }
}

/// What a step's forward gives the samplers.
enum StepLogits {
    /// Each planned row's logits, on the host.
    Rows(Vec<Vec<f32>>),
    /// Each planned row's token, picked on the device.
    Picked(Vec<u32>),
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown".to_string())
}
