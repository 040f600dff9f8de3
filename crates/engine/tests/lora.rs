//! LoRA adapters through the engine, on the real default model (SmolLM2-135M
//! GGUF): a seeded random adapter with nonzero `B`; sequences with and
//! without it batched together answer as they do alone and differ from each
//! other; preemption keeps the adapter; the prefix cache never shares blocks
//! between adapters; the adapter cache loads once and evicts by LRU.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use hearth_core::{GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::adapters::LoadFuture;
use hearth_engine::load::load_gguf;
use hearth_engine::{
    AdapterLoader, EngineConfig, EngineHandle, EngineParts, LoadedAdapter, PeftFiles, TokenStream,
};
use hearth_models::{LoraAdapter, LoraConfig, LoraSpec, LoraTarget, LoraWeights};
use tokenizers::Tokenizer;

/// Bytes of one KV block of SmolLM2-135M (see scheduler.rs).
const BLOCK_BYTES: usize = 30 * 2 * 3 * 16 * 64 * 2;

fn start(config: EngineConfig, context: usize) -> (EngineHandle, Arc<Tokenizer>, LoraSpec) {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let spec = lm.model.lora_spec().expect("llama takes adapters");
    let tokenizer = Arc::new(lm.tokenizer);
    let engine = EngineHandle::start(
        EngineParts {
            model: lm.model,
            tokenizer: tokenizer.clone(),
            eos_ids: lm.eos_ids,
            context_length: context,
        },
        config,
    )
    .unwrap();
    (engine, tokenizer, spec)
}

/// Deterministic values in [-1, 1) (xorshift).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A rank-8 adapter on q, v, o and down of every layer, HF layout, with
/// entries of +-0.05 (B nonzero), alpha 16.
fn random_adapter(spec: &LoraSpec, seed: u64) -> LoraAdapter {
    let i = &spec.info;
    let (h, q, kv, ff, r) = (
        i.hidden_size,
        i.num_heads * i.head_dim,
        i.num_kv_heads * i.head_dim,
        spec.intermediate_size,
        8,
    );
    let targets = [
        LoraTarget::Q,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Down,
    ];
    let m = |s: u64, rows: usize, cols: usize| {
        let v: Vec<f32> = values(s, rows * cols).iter().map(|x| x * 0.05).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    };
    let layers = (0..i.num_layers)
        .map(|l| {
            let mut layer = BTreeMap::new();
            for (j, t) in targets.into_iter().enumerate() {
                let (o, inp) = match t {
                    LoraTarget::Q => (q, h),
                    LoraTarget::V => (kv, h),
                    LoraTarget::O => (h, q),
                    _ => (h, ff),
                };
                let s = seed * 100_000 + (l * 10 + j) as u64 * 2;
                layer.insert(t, LoraWeights::new(m(s, r, inp), m(s + 1, o, r)));
            }
            layer
        })
        .collect();
    LoraAdapter {
        config: LoraConfig {
            r,
            alpha: 16.0,
            dropout: 0.0,
            use_rslora: false,
            targets: targets.to_vec(),
            base_model: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
        },
        layers,
    }
}

/// A loader handing out the adapter's PEFT files, counting its calls.
fn loader(adapter: &LoraAdapter, calls: Arc<AtomicUsize>) -> AdapterLoader {
    let (weights, config) = adapter.to_peft().unwrap();
    let files = PeftFiles { weights, config };
    Arc::new(move || -> LoadFuture {
        calls.fetch_add(1, Ordering::SeqCst);
        let files = files.clone();
        Box::pin(async move { Ok::<_, anyhow::Error>(files) })
    })
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn submit(
    engine: &EngineHandle,
    prompt: &[u32],
    max_tokens: usize,
    adapter: Option<&LoadedAdapter>,
) -> TokenStream {
    let request = GenerateRequest {
        id: "t".into(),
        prompt_ids: prompt.to_vec(),
        params: SamplingParams {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
        priority: Priority::Interactive,
        adapter: None,
        cache_scope: None,
        constraint: None,
    };
    engine.submit_with(request, adapter.cloned()).unwrap()
}

fn collect(mut stream: TokenStream) -> Vec<u32> {
    let mut ids = Vec::new();
    loop {
        match stream.blocking_recv().expect("stream ends with Finished") {
            TokenEvent::Token { id, .. } => ids.push(id),
            TokenEvent::Finished { .. } => return ids,
            TokenEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, true).unwrap().get_ids().to_vec()
}

#[test]
fn base_and_adapter_in_one_batch_equal_their_solo_runs() {
    let (engine, tok, spec) = start(EngineConfig::default(), 2048);
    let calls = Arc::new(AtomicUsize::new(0));
    let x = random_adapter(&spec, 1);
    let load = loader(&x, calls.clone());
    // Two concurrent first requests share one load.
    let (a, b) = block_on(async {
        tokio::join!(
            engine.adapters().get("x", &load),
            engine.adapters().get("x", &load)
        )
    });
    let (lx, _) = (a.unwrap(), b.unwrap());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let prompt = encode(&tok, "The capital of France is");
    let other = encode(&tok, "Once upon a time, in a small village,");
    let base_alone = collect(submit(&engine, &prompt, 24, None));
    let lora_alone = collect(submit(&engine, &prompt, 24, Some(&lx)));
    let other_alone = collect(submit(&engine, &other, 24, Some(&lx)));
    assert_ne!(base_alone, lora_alone, "the adapter changed nothing");

    let streams = [
        submit(&engine, &prompt, 24, Some(&lx)),
        submit(&engine, &prompt, 24, None),
        submit(&engine, &other, 24, Some(&lx)),
    ];
    let [s0, s1, s2] = streams;
    let (t0, t1, t2) = (collect(s0), collect(s1), collect(s2));
    assert_eq!(t0, lora_alone);
    assert_eq!(t1, base_alone);
    assert_eq!(t2, other_alone);
    eprintln!(
        "base: {:?}\nlora: {:?}",
        tok.decode(&base_alone, true).unwrap(),
        tok.decode(&lora_alone, true).unwrap()
    );
}

#[test]
fn the_prefix_cache_is_separate_per_adapter() {
    let (engine, tok, spec) = start(EngineConfig::default(), 2048);
    let calls = Arc::new(AtomicUsize::new(0));
    let lx = block_on(
        engine
            .adapters()
            .get("x", &loader(&random_adapter(&spec, 1), calls.clone())),
    )
    .unwrap();
    let ly = block_on(
        engine
            .adapters()
            .get("y", &loader(&random_adapter(&spec, 2), calls.clone())),
    )
    .unwrap();
    let prompt = encode(
        &tok,
        "You are a careful assistant for a public library. You answer questions about \
         opening hours, borrowing rules, late fees and events, briefly and politely. \
         Question: when do you open?",
    );
    assert!(prompt.len() > 32);
    let lora_first = collect(submit(&engine, &prompt, 8, Some(&lx)));
    let hits = engine.prefix_hit_blocks();
    collect(submit(&engine, &prompt, 8, None));
    collect(submit(&engine, &prompt, 8, Some(&ly)));
    assert_eq!(
        engine.prefix_hit_blocks(),
        hits,
        "blocks shared across adapters"
    );
    let lora_again = collect(submit(&engine, &prompt, 8, Some(&lx)));
    assert!(
        engine.prefix_hit_blocks() >= hits + 2,
        "same adapter reuses"
    );
    assert_eq!(lora_first, lora_again);
    // Submitting by key alone works once loaded; unknown keys are refused.
    let mut req = GenerateRequest {
        id: "k".into(),
        prompt_ids: prompt.clone(),
        params: SamplingParams {
            max_tokens: Some(8),
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
        priority: Priority::Interactive,
        adapter: Some("x".into()),
        cache_scope: None,
        constraint: None,
    };
    assert_eq!(collect(engine.submit(req.clone()).unwrap()), lora_first);
    req.adapter = Some("nope".into());
    assert!(engine.submit(req).is_err());
}

/// Four sequences (two with the adapter) in a pool too small for all: some
/// are preempted and recomputed, and each still answers as it does alone.
#[test]
fn preempted_sequences_keep_their_adapter() {
    let config = EngineConfig {
        kv_cache_bytes: Some(12 * BLOCK_BYTES),
        ..EngineConfig::default()
    };
    let (engine, tok, spec) = start(config, 128);
    let lx = block_on(engine.adapters().get(
        "x",
        &loader(&random_adapter(&spec, 1), Arc::new(AtomicUsize::new(0))),
    ))
    .unwrap();
    let prompts: Vec<Vec<u32>> = [
        "The history of the printing press begins",
        "Photosynthesis is the process by which",
        "A good night's sleep matters because",
        "The first step in learning to swim is",
    ]
    .iter()
    .map(|p| encode(&tok, p))
    .collect();
    let with = |i: usize| i.is_multiple_of(2).then_some(&lx);
    let alone: Vec<Vec<u32>> = (0..4)
        .map(|i| collect(submit(&engine, &prompts[i], 60, with(i))))
        .collect();
    assert_eq!(engine.preemptions(), 0);
    let streams: Vec<TokenStream> = (0..4)
        .map(|i| submit(&engine, &prompts[i], 60, with(i)))
        .collect();
    let together: Vec<Vec<u32>> = streams.into_iter().map(collect).collect();
    assert!(engine.preemptions() > 0, "the pool was never short");
    assert_eq!(alone, together);
}

#[test]
fn the_adapter_cache_is_a_bounded_lru() {
    let config = EngineConfig {
        max_adapters: 2,
        ..EngineConfig::default()
    };
    let (engine, _tok, spec) = start(config, 256);
    let cache = engine.adapters();
    let calls = Arc::new(AtomicUsize::new(0));
    let loaders: Vec<AdapterLoader> = (1..=3)
        .map(|s| loader(&random_adapter(&spec, s), calls.clone()))
        .collect();
    let held = block_on(async {
        let a = cache.get("a", &loaders[0]).await.unwrap();
        cache.get("b", &loaders[1]).await.unwrap();
        cache.get("a", &loaders[0]).await.unwrap(); // a is now newer than b
        cache.get("c", &loaders[2]).await.unwrap(); // evicts b
        a
    });
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let keys: Vec<String> = cache.loaded().iter().map(|k| k.to_string()).collect();
    assert_eq!(keys, ["c", "a"]);
    // A held Arc outlives eviction.
    block_on(cache.get("b", &loaders[1])).unwrap(); // evicts a
    assert!(cache.peek("a").is_none());
    assert_eq!(held.adapter.num_layers(), spec.info.num_layers);
    // A loader error surfaces and is retried next time.
    let failing: AdapterLoader =
        Arc::new(|| -> LoadFuture { Box::pin(async { Err(anyhow::anyhow!("no such blob")) }) });
    let err = block_on(cache.get("d", &failing)).unwrap_err();
    assert!(err.to_string().contains("no such blob"));
    // Wrong shapes are refused with the layer and module named.
    let mut bad = random_adapter(&spec, 4);
    let w = bad.layers[3].get_mut(&LoraTarget::V).unwrap();
    w.b = Tensor::zeros((7, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = block_on(cache.get("bad", &loader(&bad, calls.clone()))).unwrap_err();
    assert!(format!("{err:#}").contains("v_proj"), "{err:#}");
}
