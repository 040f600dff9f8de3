//! Driving an [`EngineHandle`] the way llama-bench's tests do, shared by the
//! criterion `engine` bench and the `engine_rounds` example: greedy
//! sequences with varied prompts, `ignore_eos`, timed from the last first
//! token to the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_core::{GenerateRequest, SamplingParams, TokenEvent};
use hearth_engine::load::LoadedLm;
use hearth_engine::{EngineConfig, EngineHandle, EngineParts, TokenStream};
use hearth_models::CausalLM;

/// As the server: large blocks (weights, the KV pool) on huge pages
/// (`HEARTH_HUGE_PAGES=0` turns that off, for comparisons).
#[global_allocator]
static ALLOC: hearth_kernels::HugePageAlloc = hearth_kernels::HugePageAlloc;

/// An engine over `lm` (its model, or `model` in its place) with room for 64 sequences and 512-token steps
/// (a 512-token prompt is one step, as llama-bench's pp512 is one batch).
/// `HEARTH_BENCH_KV_MB` sizes the KV pool (default: the engine's).
pub fn start(lm: LoadedLm, model: Option<Box<dyn CausalLM>>) -> EngineHandle {
    let kv_cache_bytes = std::env::var("HEARTH_BENCH_KV_MB")
        .ok()
        .map(|mb| mb.parse::<usize>().expect("HEARTH_BENCH_KV_MB: MiB") << 20);
    EngineHandle::start(
        EngineParts {
            model: model.unwrap_or(lm.model),
            tokenizer: Arc::new(lm.tokenizer),
            eos_ids: lm.eos_ids,
            context_length: 8192,
        },
        EngineConfig {
            max_waiting: 256,
            max_active: 64,
            max_batch_tokens: 512,
            kv_cache_bytes,
            ..EngineConfig::default()
        },
    )
    .expect("starting the engine")
}

/// The device named by `HEARTH_BENCH_DEVICE` (`cpu`, `cuda`, `cuda:N`...;
/// default `cpu`).
pub fn bench_device() -> hearth_engine::Device {
    hearth_engine::DeviceSpec::open_from_env("HEARTH_BENCH_DEVICE")
}

/// Varied in-vocabulary token ids, different per sequence.
pub fn prompt(seq: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (1000 + (seq * 7919 + j * 104_729) % 40_000) as u32)
        .collect()
}

pub fn submit(
    engine: &EngineHandle,
    seq: usize,
    prompt_len: usize,
    max_tokens: usize,
) -> TokenStream {
    engine
        .submit(GenerateRequest {
            id: format!("bench-{seq}"),
            prompt_ids: prompt(seq, prompt_len),
            params: SamplingParams {
                max_tokens: Some(max_tokens),
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            priority: Default::default(),
            adapter: None,
            cache_scope: None,
            constraint: None,
        })
        .expect("submit")
}

/// Reads one stream to its end: (time of the first token, tokens).
pub async fn drain(mut stream: TokenStream) -> (Instant, usize) {
    let mut first = None;
    let mut tokens = 0;
    while let Some(event) = stream.recv().await {
        match event {
            TokenEvent::Token { .. } => {
                first.get_or_insert_with(Instant::now);
                tokens += 1;
            }
            TokenEvent::Finished { .. } => break,
            TokenEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
    (first.expect("at least one token"), tokens)
}

/// One decode round of `b` sequences with prompts of `prompt` tokens,
/// `decode` tokens after the first: the decode-phase time.
pub fn decode_round(
    rt: &tokio::runtime::Runtime,
    engine: &EngineHandle,
    b: usize,
    prompt: usize,
    decode: usize,
) -> Duration {
    let streams: Vec<TokenStream> = (0..b)
        .map(|i| submit(engine, i, prompt, decode + 1))
        .collect();
    let outcomes = rt.block_on(futures_util::future::join_all(
        streams.into_iter().map(drain),
    ));
    let end = Instant::now();
    let last_first = outcomes.iter().map(|o| o.0).max().unwrap();
    assert!(outcomes.iter().all(|o| o.1 == decode + 1));
    end - last_first
}

/// One `len`-token prompt with `max_tokens` 1, submit to end.
pub fn prefill_once(
    rt: &tokio::runtime::Runtime,
    engine: &EngineHandle,
    seq: usize,
    len: usize,
) -> Duration {
    let start = Instant::now();
    let (_, n) = rt.block_on(drain(submit(engine, seq, len, 1)));
    assert_eq!(n, 1);
    start.elapsed()
}
