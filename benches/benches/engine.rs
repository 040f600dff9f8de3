//! Criterion bench of the chat engine on the default model
//! (SmolLM2-135M-Instruct, Q4_1 GGUF), through [`EngineHandle`] as the server
//! drives it.
//!
//! - `decode/B`: B concurrent greedy sequences (8-token prompts, all
//!   prefilled in the first step), `ignore_eos`, 33 tokens each; the time is
//!   from the last sequence's first token to the last one's end, and the
//!   throughput counts the 32 tokens each sequence decodes in it.
//! - `decode/B1x128`: llama-bench's `tg128` shape: one sequence, a 1-token
//!   prompt, 128 decoded tokens timed as above.
//! - `prefill/512`: one 512-token prompt with `max_tokens` 1, submit to end.
//! - `scheduler/B`: the engine's own cost per step. The same rounds as
//!   `decode/B` through an engine whose model is a tiny random Llama (2
//!   layers, hidden 16, the real 49,152-token vocabulary and tokenizer), so
//!   a step is almost all scheduling, block bookkeeping, sampling over the
//!   vocabulary, detokenization and sending events; throughput in steps
//!   (one decoded token per sequence each).
//!
//! The model is read from `$HEARTH_DATA_DIR/models` (default: the
//! repository's `data/models`); without it the bench says so and skips.
//! `HEARTH_BENCH_GGUF` names another GGUF to measure instead, such as the
//! 1B- and 8B-shaped files `hearth-synth-gguf` writes (the `scheduler`
//! group keeps the default model's tokenizer).
//!
//! ```sh
//! cargo bench -p hearth-benches --bench engine
//! HEARTH_BENCH_GGUF=/tmp/synth-8b.Q4_K_M.gguf \
//!     cargo bench -p hearth-benches --bench engine -- 'B1x128|prefill'
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use hearth_core::{GenerateRequest, SamplingParams, TokenEvent};
use hearth_engine::load::load_gguf;
use hearth_engine::{Device, EngineConfig, EngineHandle, EngineParts, TokenStream};
use hearth_models::{CausalLM, Llama, LlamaConfig};

const GGUF: &str = "models/HuggingFaceTB--SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
const BATCHES: [usize; 4] = [1, 4, 16, 64];
const PROMPT_LEN: usize = 8;
const DECODE: usize = 32;
const PREFILL_LEN: usize = 512;

fn data_dir() -> PathBuf {
    std::env::var_os("HEARTH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
}

/// The default model, or a tiny random Llama with the default model's
/// tokenizer (`tiny`).
fn start_engine(tiny: bool) -> Option<EngineHandle> {
    let path = match std::env::var_os("HEARTH_BENCH_GGUF") {
        Some(p) if !tiny => PathBuf::from(p),
        _ => data_dir().join(GGUF),
    };
    if !path.exists() {
        eprintln!(
            "engine bench skipped: {} is missing (run `hearth models pull` first)",
            path.display()
        );
        return None;
    }
    let lm = load_gguf(&path, &Device::Cpu).expect("loading the GGUF");
    let model: Box<dyn CausalLM> = if tiny {
        Box::new(tiny_llama(lm.model.info().vocab_size))
    } else {
        lm.model
    };
    Some(
        EngineHandle::start(
            EngineParts {
                model,
                tokenizer: Arc::new(lm.tokenizer),
                eos_ids: lm.eos_ids,
                context_length: 2048,
            },
            EngineConfig {
                max_waiting: 256,
                max_active: 64,
                max_batch_tokens: 512,
                ..EngineConfig::default()
            },
        )
        .expect("starting the engine"),
    )
}

/// Two layers of hidden size 16 with random weights over `vocab` tokens.
fn tiny_llama(vocab: usize) -> Llama {
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 2048, "vocab_size": vocab, "tie_word_embeddings": true
    }))
    .expect("tiny config");
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu);
    Llama::from_safetensors(&config, vb).expect("tiny Llama")
}

/// Varied in-vocabulary token ids, different per sequence.
fn prompt(seq: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (1000 + (seq * 7919 + j * 104_729) % 40_000) as u32)
        .collect()
}

fn submit(engine: &EngineHandle, seq: usize, prompt_len: usize, max_tokens: usize) -> TokenStream {
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
async fn drain(mut stream: TokenStream) -> (Instant, usize) {
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
fn decode_round(
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

fn bench_engine(c: &mut Criterion) {
    hearth_benches::pin_rayon_threads();
    let Some(engine) = start_engine(false) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    decode_round(&rt, &engine, 4, PROMPT_LEN, DECODE); // page the weights in

    let mut group = c.benchmark_group("decode");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for b in BATCHES {
        group.throughput(Throughput::Elements((b * DECODE) as u64));
        group.bench_function(format!("B{b}"), |bench| {
            bench.iter_custom(|iters| {
                (0..iters)
                    .map(|_| decode_round(&rt, &engine, b, PROMPT_LEN, DECODE))
                    .sum()
            })
        });
    }
    group.throughput(Throughput::Elements(128));
    group.bench_function("B1x128", |bench| {
        bench.iter_custom(|iters| {
            (0..iters)
                .map(|_| decode_round(&rt, &engine, 1, 1, 128))
                .sum()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("prefill");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(PREFILL_LEN as u64));
    let mut seq = 0;
    group.bench_function(format!("{PREFILL_LEN}"), |bench| {
        bench.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    seq += 1;
                    let start = Instant::now();
                    let (_, n) = rt.block_on(drain(submit(&engine, seq, PREFILL_LEN, 1)));
                    assert_eq!(n, 1);
                    start.elapsed()
                })
                .sum()
        })
    });
    group.finish();
}

fn bench_scheduler(c: &mut Criterion) {
    let Some(engine) = start_engine(true) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("scheduler");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for b in BATCHES {
        group.throughput(Throughput::Elements(DECODE as u64));
        group.bench_function(format!("B{b}"), |bench| {
            bench.iter_custom(|iters| {
                (0..iters)
                    .map(|_| decode_round(&rt, &engine, b, PROMPT_LEN, DECODE))
                    .sum()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_engine, bench_scheduler);
criterion_main!(benches);
