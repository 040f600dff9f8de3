//! Batch-class work beside interactive work, on a model whose steps take a
//! known time per token: batch tokens never share a step with an
//! interactive prompt, and once the engine has measured its steps, the
//! batch tokens of a step fit in `batch_step_time`; an interactive request
//! that finds every slot taken by batch work evicts some instead of
//! waiting for it to end.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use hearth_core::{GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::load::load_gguf;
use hearth_engine::{EngineConfig, EngineHandle, EngineParts, TokenStream};
use hearth_models::{CausalLM, KvCache, KvPool, ModelInfo, PagedSeq};

const INTERACTIVE: u32 = 7;
const BATCH: u32 = 5;
const PER_TOKEN: Duration = Duration::from_millis(2);

/// One planned chunk: its class token, length and first position.
type Chunk = (u32, usize, usize);

/// Sleeps `PER_TOKEN` per token of a step, records the chunks, and answers
/// logits whose argmax repeats each chunk's last token, so a sequence keeps
/// decoding the token of its class.
struct Timed {
    real: Box<dyn CausalLM>,
    steps: Arc<Mutex<Vec<Vec<Chunk>>>>,
}

impl CausalLM for Timed {
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> candle_core::Result<Tensor> {
        self.real.forward(tokens, cache)
    }

    fn forward_paged(
        &self,
        seqs: &[PagedSeq<'_>],
        _pool: &mut KvPool,
    ) -> candle_core::Result<Tensor> {
        let tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        std::thread::sleep(PER_TOKEN * tokens as u32);
        let chunks = seqs
            .iter()
            .map(|s| (s.tokens[0], s.tokens.len(), s.pos))
            .collect();
        self.steps.lock().unwrap().push(chunks);
        let vocab = self.real.info().vocab_size;
        let mut rows = vec![0f32; seqs.len() * vocab];
        for (i, s) in seqs.iter().enumerate() {
            rows[i * vocab + *s.tokens.last().unwrap() as usize] = 1.0;
        }
        Tensor::from_vec(rows, (seqs.len(), vocab), &Device::Cpu)
    }

    fn info(&self) -> &ModelInfo {
        self.real.info()
    }

    fn new_cache(&self) -> KvCache {
        self.real.new_cache()
    }

    fn new_pool(&self, num_blocks: usize) -> candle_core::Result<KvPool> {
        self.real.new_pool(num_blocks)
    }

    fn kv_dtype(&self) -> DType {
        self.real.kv_dtype()
    }
}

fn submit(
    engine: &EngineHandle,
    token: u32,
    len: usize,
    max_tokens: usize,
    priority: Priority,
) -> TokenStream {
    engine
        .submit(GenerateRequest {
            id: format!("{priority:?}"),
            prompt_ids: vec![token; len],
            params: SamplingParams {
                max_tokens: Some(max_tokens),
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            priority,
            adapter: None,
            cache_scope: None,
            constraint: None,
        })
        .unwrap()
}

/// Reads a stream to its end; the tokens it generated.
fn drain(mut stream: TokenStream) -> usize {
    let mut n = 0;
    loop {
        match stream.blocking_recv() {
            Some(TokenEvent::Token { .. }) => n += 1,
            Some(TokenEvent::Finished { .. }) | None => return n,
            Some(TokenEvent::Error(e)) => panic!("{e}"),
        }
    }
}

/// An engine over [`Timed`]; the steps it records.
fn start(config: EngineConfig) -> (EngineHandle, Arc<Mutex<Vec<Vec<Chunk>>>>) {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let steps = Arc::new(Mutex::new(Vec::new()));
    let engine = EngineHandle::start(
        EngineParts {
            model: Box::new(Timed {
                real: lm.model,
                steps: steps.clone(),
            }),
            tokenizer: Arc::new(lm.tokenizer),
            eos_ids: lm.eos_ids,
            context_length: 512,
        },
        config,
    )
    .unwrap();
    (engine, steps)
}

#[test]
fn batch_tokens_keep_to_their_time_and_never_join_an_interactive_prompt() {
    let batch_step_time = Duration::from_millis(20);
    let (engine, steps) = start(EngineConfig {
        batch_step_time,
        ..EngineConfig::default()
    });

    // Eight batch sequences with long prompts, then, while they run,
    // interactive requests one after another.
    let batch: Vec<TokenStream> = (0..8)
        .map(|_| submit(&engine, BATCH, 120, 16, Priority::Batch))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let stream = submit(&engine, INTERACTIVE, 60, 4, Priority::Interactive);
        assert_eq!(drain(stream), 4);
    }
    for stream in batch {
        assert_eq!(drain(stream), 16);
    }

    let steps = steps.lock().unwrap();
    let budget = (batch_step_time.as_micros() / PER_TOKEN.as_micros()) as usize;
    let batch_tokens =
        |step: &Vec<Chunk>| -> usize { step.iter().filter(|c| c.0 == BATCH).map(|c| c.1).sum() };
    let is_interactive = |step: &Vec<Chunk>| step.iter().any(|c| c.0 == INTERACTIVE);
    let first = steps
        .iter()
        .position(is_interactive)
        .expect("interactive steps");
    let last = steps.iter().rposition(is_interactive).unwrap();
    let mut with_interactive_prompt = 0;
    for (n, step) in steps.iter().enumerate() {
        if step.iter().any(|c| c.0 == INTERACTIVE && c.2 < 60) {
            with_interactive_prompt += 1;
            assert_eq!(
                batch_tokens(step),
                0,
                "step {n} mixes batch work into an interactive prompt: {step:?}"
            );
        }
        // While interactive work runs, batch work keeps to its time
        // (measured steps only ever look slower than `PER_TOKEN`, so the
        // budget can only be smaller than `budget`).
        if (first..=last).contains(&n) {
            assert!(
                batch_tokens(step) <= budget,
                "step {n}: {} batch tokens, budget {budget}: {step:?}",
                batch_tokens(step)
            );
        }
    }
    assert!(with_interactive_prompt >= 3, "the interactive prompts ran");
    // Before any interactive request, the batch ran in larger steps (the
    // first one planned before any step was measured).
    let quiet = steps[1..first].iter().map(batch_tokens).max().unwrap_or(0);
    assert!(
        quiet > budget,
        "quiet steps took at most {quiet} batch tokens"
    );
}

#[test]
fn an_interactive_request_evicts_batch_work_for_a_slot() {
    let (engine, _steps) = start(EngineConfig {
        max_active: 4,
        ..EngineConfig::default()
    });
    let batch: Vec<TokenStream> = (0..4)
        .map(|_| submit(&engine, BATCH, 20, 300, Priority::Batch))
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // Every slot is taken by batch work that runs for a long while yet.
    let stream = submit(&engine, INTERACTIVE, 20, 4, Priority::Interactive);
    assert_eq!(drain(stream), 4);
    assert!(
        engine.preemptions() >= 1,
        "a batch sequence gave its slot up"
    );
    // The evicted batch sequence is recomputed and still gets every token.
    for stream in batch {
        assert_eq!(drain(stream), 300);
    }
}

#[test]
fn batch_steps_grow_after_a_long_quiet() {
    let batch_step_time = Duration::from_millis(10);
    let (engine, steps) = start(EngineConfig {
        batch_step_time,
        batch_long_quiet: Duration::from_secs(3),
        ..EngineConfig::default()
    });
    // One interactive request, then 48 batch sequences decoding together.
    // For 2 s after it, batch steps hold what fits in 10 ms; then in 5 x
    // 10 ms (about 20 tokens at 2 ms and more each: fewer than the 48
    // decodes); after 3 s, in 25 x 10 ms: every sequence still running
    // (more than 30 of them) decodes each step.
    assert_eq!(
        drain(submit(&engine, INTERACTIVE, 4, 1, Priority::Interactive)),
        1
    );
    let batch: Vec<TokenStream> = (0..48)
        .map(|_| submit(&engine, BATCH, 1, 80, Priority::Batch))
        .collect();
    for stream in batch {
        assert_eq!(drain(stream), 80);
    }
    let steps = steps.lock().unwrap();
    let tokens: Vec<usize> = steps
        .iter()
        .map(|s| s.iter().filter(|c| c.0 == BATCH).map(|c| c.1).sum())
        .filter(|&n| n > 0)
        .collect();
    let budget = (batch_step_time.as_micros() / PER_TOKEN.as_micros()) as usize;
    // The first batch steps, planned before a batch step was measured,
    // take a fixed share; then the linger holds them to the short budget
    // for a long run of steps.
    let start = tokens
        .windows(20)
        .position(|w| w.iter().all(|&n| n <= budget))
        .unwrap_or_else(|| panic!("no short steps: {tokens:?}"));
    let tokens = &tokens[start..];
    let middle = tokens
        .iter()
        .position(|&n| n > budget && n <= 26)
        .unwrap_or_else(|| panic!("no 5x steps: {tokens:?}"));
    let full = tokens
        .iter()
        .position(|&n| n >= 30)
        .unwrap_or_else(|| panic!("no full steps: {tokens:?}"));
    assert!(middle < full, "{tokens:?}");
}
