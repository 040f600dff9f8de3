//! The engine loop on the real default model: greedy output against
//! llama.cpp's reference prefix, concurrent sequences, departed clients.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use hearth_core::{FinishReason, GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::load::load_gguf;
use hearth_engine::{EngineConfig, EngineHandle, EngineParts};
use serde_json::Value;

fn start(mut config: EngineConfig) -> EngineHandle {
    let device = common::test_device();
    if !device.is_cpu() {
        // Not 90% of the GPU per engine: the tests start several.
        config.kv_cache_bytes.get_or_insert(256 << 20);
    }
    let lm = load_gguf(&common::smollm_gguf(), &device).unwrap();
    EngineHandle::start(
        EngineParts {
            model: lm.model,
            tokenizer: Arc::new(lm.tokenizer),
            eos_ids: lm.eos_ids,
            context_length: 8192,
        },
        config,
    )
    .unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Runs a request to the end; returns the token ids, the text and the finish.
fn run(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> (Vec<u32>, String, FinishReason) {
    let mut stream = engine
        .submit(GenerateRequest {
            id: "t".into(),
            prompt_ids: prompt,
            params,
            priority: Priority::Interactive,
            adapter: None,
            cache_scope: None,
            constraint: None,
        })
        .unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    loop {
        match stream
            .blocking_recv()
            .expect("the engine ends every stream with Finished")
        {
            TokenEvent::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            TokenEvent::Finished {
                reason, text: t, ..
            } => {
                text.push_str(&t);
                return (ids, text, reason);
            }
            TokenEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
}

/// "The capital of France is" in the default model's tokens.
fn france_prompt() -> Vec<u32> {
    let tokenizer = load_gguf(&common::smollm_gguf(), &Device::Cpu)
        .unwrap()
        .tokenizer;
    tokenizer
        .encode("The capital of France is", true)
        .unwrap()
        .get_ids()
        .to_vec()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(max_tokens),
        ..SamplingParams::greedy()
    }
}

#[test]
fn greedy_generation_matches_llama_cpp_up_to_the_strict_prefix() {
    let engine = start(EngineConfig::default());
    let fixture = common::fixture("smollm2_greedy.json");
    for case in fixture["cases"].as_array().unwrap() {
        let reference = ids(&case["generated_token_ids"]);
        let strict = case["strict_prefix_len"].as_u64().unwrap() as usize;
        let (ours, _, _) = run(
            &engine,
            ids(&case["prompt_token_ids"]),
            greedy(reference.len()),
        );
        let common_prefix = ours
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "{}: common prefix {common_prefix} of {} (strict {strict})",
            case["name"],
            reference.len()
        );
        assert!(
            common_prefix >= strict,
            "{}: {ours:?} vs {reference:?}",
            case["name"]
        );
    }
}

#[test]
fn eight_prompts_joining_at_different_steps_match_one_at_a_time() {
    if !common::test_device().is_cpu() {
        // Bit-for-bit equality across batch shapes is a property of the CPU
        // kernels; candle's CUDA matmuls pick other kernels (other roundings)
        // by row count. models/tests/gpu.rs checks GPU batching with limits.
        eprintln!("skipped on a GPU: batch-shape rounding differs there");
        return;
    }
    let engine = start(EngineConfig {
        max_active: 8,
        max_batch_tokens: 64,
        ..EngineConfig::default()
    });
    let tokenizer = load_gguf(&common::smollm_gguf(), &Device::Cpu)
        .unwrap()
        .tokenizer;
    let fixture = common::fixture("smollm2_greedy.json");
    // chat_1 is left out: its first step is a near-tie (reference top-2 margin
    // 0.001), which a different split of the prefill may flip through float
    // summation order alone. Every other prompt must match token for token.
    let mut prompts: Vec<Vec<u32>> = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] != "chat_1")
        .map(|c| ids(&c["prompt_token_ids"]))
        .collect();
    for text in [
        "Water boils at",
        "The three laws of motion were written by",
        "A recipe for pancakes:",
    ] {
        prompts.push(tokenizer.encode(text, true).unwrap().get_ids().to_vec());
    }
    assert_eq!(prompts.len(), 8);
    let alone: Vec<_> = prompts
        .iter()
        .map(|p| run(&engine, p.clone(), greedy(12)).0)
        .collect();
    // Staggered starts: later prompts join while earlier ones prefill or decode,
    // and the 64-token budget splits the longer chat prompts over several steps.
    let together: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let engine = engine.clone();
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(40 * i as u64));
                    run(&engine, p.clone(), greedy(12)).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
}

#[test]
fn the_stop_string_ends_generation_and_max_tokens_gives_length() {
    let engine = start(EngineConfig::default());
    let prompt = france_prompt();
    let (_, text, reason) = run(&engine, prompt.clone(), greedy(3));
    assert_eq!(reason, FinishReason::Length);
    assert!(text.starts_with(" Paris"), "{text:?}");
    let params = SamplingParams {
        stop: vec!["aris".into()],
        ..greedy(10)
    };
    let (_, text, reason) = run(&engine, prompt, params);
    assert_eq!((text.as_str(), reason), (" P", FinishReason::Stop));
}

#[test]
fn a_dropped_stream_frees_its_sequence() {
    let engine = start(EngineConfig::default());
    let params = SamplingParams {
        ignore_eos: true,
        ..greedy(5000)
    };
    let mut stream = engine
        .submit(GenerateRequest {
            id: "gone".into(),
            prompt_ids: vec![1, 504, 3458],
            params,
            priority: Priority::Interactive,
            adapter: None,
            cache_scope: None,
            constraint: None,
        })
        .unwrap();
    assert!(matches!(
        stream.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    assert_eq!(engine.active_sequences(), 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.active_sequences() != 0 {
        assert!(Instant::now() < deadline, "the sequence was not freed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_full_queue_refuses_at_once() {
    let engine = start(EngineConfig {
        max_waiting: 1,
        max_active: 1,
        ..EngineConfig::default()
    });
    let params = SamplingParams {
        ignore_eos: true,
        ..greedy(400)
    };
    let req = |id: &str| GenerateRequest {
        id: id.into(),
        prompt_ids: vec![1, 504],
        params: params.clone(),
        priority: Priority::Interactive,
        adapter: None,
        cache_scope: None,
        constraint: None,
    };
    let mut first = engine.submit(req("a")).unwrap();
    assert!(matches!(
        first.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    let _second = engine.submit(req("b")).unwrap();
    let third = engine.submit(req("c"));
    assert!(
        matches!(third, Err(hearth_core::EngineError::Overloaded(1))),
        "{third:?}"
    );
}

#[test]
fn a_stopped_engine_ends_its_sequences_and_refuses_new_ones() {
    let engine = start(EngineConfig {
        max_active: 1,
        threads: Some(1),
        ..EngineConfig::default()
    });
    let req = |id: &str| GenerateRequest {
        id: id.into(),
        prompt_ids: vec![1, 504, 3458],
        params: SamplingParams {
            ignore_eos: true,
            ..greedy(5000)
        },
        priority: Priority::Interactive,
        adapter: None,
        cache_scope: None,
        constraint: None,
    };
    let mut running = engine.submit(req("running")).unwrap();
    assert!(matches!(
        running.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    let mut waiting = engine.submit(req("waiting")).unwrap();
    engine.stop();
    for stream in [&mut running, &mut waiting] {
        let last = std::iter::from_fn(|| stream.blocking_recv()).last();
        assert_eq!(
            last,
            Some(TokenEvent::Error(hearth_core::EngineError::Stopped))
        );
    }
    // The loop is gone: nothing takes requests any more.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match engine.submit(req("late")) {
            Err(e) => {
                assert_eq!(e, hearth_core::EngineError::Stopped);
                break;
            }
            Ok(_) => assert!(Instant::now() < deadline, "the engine still takes requests"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Unseeded temperature sampling (drawn on the device on a GPU, by the
/// host sampler on the CPU): cold, the likeliest first token nearly
/// always; hot, many different ones.
#[test]
fn temperature_draws_follow_the_temperature() {
    let engine = start(EngineConfig::default());
    let prompt = france_prompt();
    let (best, _, _) = run(&engine, prompt.clone(), greedy(1));
    let first = |temperature: f32| -> Vec<u32> {
        (0..20)
            .map(|_| {
                let params = SamplingParams {
                    max_tokens: Some(1),
                    temperature,
                    ..SamplingParams::default()
                };
                run(&engine, prompt.clone(), params).0[0]
            })
            .collect()
    };
    let cold = first(0.2);
    let likeliest = cold.iter().filter(|&&id| id == best[0]).count();
    assert!(likeliest >= 15, "T 0.2: {likeliest} of 20 drew the argmax");
    let mut hot = first(5.0);
    hot.sort_unstable();
    hot.dedup();
    assert!(
        hot.len() >= 5,
        "T 5: only {} different tokens in 20",
        hot.len()
    );
}
