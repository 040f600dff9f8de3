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
//! group keeps the default model's tokenizer). `HEARTH_BENCH_DEVICE`
//! (`cpu`, `cuda`, `cuda:N`; default `cpu`) loads it onto another device
//! in a binary built with that backend's feature.
//!
//! ```sh
//! cargo bench -p hearth-benches --bench engine
//! HEARTH_BENCH_GGUF=/tmp/synth-8b.Q4_K_M.gguf \
//!     cargo bench -p hearth-benches --bench engine -- 'B1x128|prefill'
//! ```

#[path = "shared/engine_run.rs"]
mod engine_run;

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use engine_run::{decode_round, prefill_once};
use hearth_engine::load::load_gguf;
use hearth_engine::{Device, EngineHandle};
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
    let lm = load_gguf(&path, &engine_run::bench_device()).expect("loading the GGUF");
    let tiny: Option<Box<dyn CausalLM>> =
        tiny.then(|| Box::new(tiny_llama(lm.model.info().vocab_size)) as Box<dyn CausalLM>);
    Some(engine_run::start(lm, tiny))
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
                    prefill_once(&rt, &engine, seq, PREFILL_LEN)
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
