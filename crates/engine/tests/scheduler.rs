//! The scheduler over the paged KV pool, on the real default chat model:
//! preemption by recompute keeps greedy output intact, cached prompt
//! prefixes are reused, interactive work is admitted before batch work,
//! abandoned streams return their blocks, and 64 concurrent streams each
//! get exactly their tokens.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_core::{FinishReason, GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::load::load_gguf;
use hearth_engine::{Device, EngineConfig, EngineHandle, EngineParts, TokenStream};
use tokenizers::Tokenizer;

/// Bytes of one KV block of SmolLM2-135M: 30 layers x (k, v) x 3 heads x
/// 16 positions x 64 dims x f16.
const BLOCK_BYTES: usize = 30 * 2 * 3 * 16 * 64 * 2;

fn start(config: EngineConfig, context_length: usize) -> (EngineHandle, Arc<Tokenizer>) {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let tokenizer = Arc::new(lm.tokenizer);
    let engine = EngineHandle::start(
        EngineParts {
            model: lm.model,
            tokenizer: tokenizer.clone(),
            eos_ids: lm.eos_ids,
            context_length,
        },
        config,
    )
    .unwrap();
    (engine, tokenizer)
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, true).unwrap().get_ids().to_vec()
}

fn submit(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    max_tokens: usize,
    priority: Priority,
) -> TokenStream {
    let params = SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    engine
        .submit(GenerateRequest {
            id: "t".into(),
            prompt_ids: prompt,
            params,
            priority,
            adapter: None,
            cache_scope: None,
            constraint: None,
        })
        .unwrap()
}

/// Reads a stream to its end: the token ids, and the finish's usage count.
fn collect(mut stream: TokenStream) -> (Vec<u32>, usize) {
    let mut ids = Vec::new();
    loop {
        match stream
            .blocking_recv()
            .expect("every stream ends with Finished")
        {
            TokenEvent::Token { id, .. } => ids.push(id),
            TokenEvent::Finished { usage, reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                return (ids, usage.completion_tokens);
            }
            TokenEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
}

fn generate(engine: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    collect(submit(engine, prompt, max_tokens, Priority::Interactive)).0
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const PROMPTS: [&str; 4] = [
    "The history of the printing press begins",
    "Photosynthesis is the process by which",
    "A good night's sleep matters because",
    "The first step in learning to swim is",
];

/// A pool of 12 blocks (192 positions) for four sequences that grow to
/// about 70 tokens each: they cannot all stay resident, so the newest are
/// preempted and recomputed, and every output still equals the sequence
/// run alone.
#[test]
fn preemption_by_recompute_keeps_greedy_output() {
    let config = EngineConfig {
        kv_cache_bytes: Some(12 * BLOCK_BYTES),
        ..EngineConfig::default()
    };
    let (engine, tok) = start(config, 128);
    assert_eq!(engine.kv_blocks(), (0, 12));
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| encode(&tok, p)).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&engine, p.clone(), 60))
        .collect();
    assert_eq!(engine.preemptions(), 0, "one at a time fits");

    let streams: Vec<TokenStream> = prompts
        .iter()
        .map(|p| submit(&engine, p.clone(), 60, Priority::Interactive))
        .collect();
    let together: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
    assert!(engine.preemptions() > 0, "the pool was never short");
    assert_eq!(alone, together);
    wait_until("the pool is empty", || engine.kv_blocks().0 == 0);
}

/// Two requests with the same 60-token system prompt: the second takes the
/// first's full blocks from the prefix cache and still answers exactly as
/// an engine without that cache does.
#[test]
fn a_shared_prompt_prefix_is_reused_not_recomputed() {
    let system = "You are a careful assistant for a public library. You answer questions about \
                  opening hours, borrowing rules, late fees and events, briefly and politely, and \
                  you never invent facts you were not given. When a question is about something \
                  else, you say so and suggest asking the front desk, which is staffed every day.";
    let (engine, tok) = start(EngineConfig::default(), 2048);
    let first = encode(&tok, &format!("{system} Question: when do you open?"));
    let second = encode(&tok, &format!("{system} Question: how much is a late fee?"));
    assert!(first.len() > 48 && second.len() > 48);
    generate(&engine, first, 4);
    let hits = engine.prefix_hit_blocks();
    let cached = generate(&engine, second.clone(), 16);
    assert!(
        engine.prefix_hit_blocks() >= hits + 3,
        "{} blocks hit",
        engine.prefix_hit_blocks() - hits
    );
    let (fresh, _) = start(EngineConfig::default(), 2048);
    assert_eq!(cached, generate(&fresh, second, 16));
}

/// Requests of different cache scopes (projects) never share cached
/// prompt blocks: one tenant cannot learn from timing what another's
/// prompts were. The same scope does share them.
#[test]
fn the_prefix_cache_is_separate_per_scope() {
    let system = "You are a careful assistant for a public library. You answer questions about \
                  opening hours, borrowing rules, late fees and events, briefly and politely.";
    let (engine, tok) = start(EngineConfig::default(), 2048);
    let prompt = encode(&tok, &format!("{system} Question: when do you open?"));
    assert!(prompt.len() > 32);
    let run = |scope: &str| {
        let stream = engine
            .submit(GenerateRequest {
                id: "scoped".into(),
                prompt_ids: prompt.clone(),
                params: SamplingParams {
                    max_tokens: Some(2),
                    ignore_eos: true,
                    ..SamplingParams::greedy()
                },
                priority: Priority::Interactive,
                adapter: None,
                cache_scope: Some(scope.into()),
                constraint: None,
            })
            .unwrap();
        collect(stream).0
    };
    let first = run("project-a");
    let hits = engine.prefix_hit_blocks();
    assert_eq!(run("project-b"), first);
    assert_eq!(
        engine.prefix_hit_blocks(),
        hits,
        "blocks shared across scopes"
    );
    assert_eq!(run("project-a"), first);
    assert!(
        engine.prefix_hit_blocks() >= hits + 2,
        "the same scope shares"
    );
}

/// With one slot, a batch request queued before an interactive one still
/// runs after it.
#[test]
fn interactive_requests_are_admitted_before_batch_work() {
    let config = EngineConfig {
        max_active: 1,
        ..EngineConfig::default()
    };
    let (engine, tok) = start(config, 512);
    let mut running = submit(&engine, encode(&tok, PROMPTS[0]), 24, Priority::Interactive);
    assert!(matches!(
        running.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    let batch = submit(&engine, encode(&tok, PROMPTS[1]), 4, Priority::Batch);
    let interactive = submit(&engine, encode(&tok, PROMPTS[2]), 4, Priority::Interactive);
    let finished = Arc::new(AtomicUsize::new(0));
    let order = std::thread::scope(|s| {
        let read = |stream: TokenStream| {
            let finished = finished.clone();
            s.spawn(move || {
                collect(stream);
                finished.fetch_add(1, Ordering::SeqCst)
            })
        };
        let (b, i) = (read(batch), read(interactive));
        collect(running);
        (b.join().unwrap(), i.join().unwrap())
    });
    assert_eq!(order, (1, 0), "(batch, interactive) finish order");
}

/// Twenty clients leave after their first token; their sequences and
/// blocks are freed and the engine serves normally afterwards.
#[test]
fn abandoned_streams_return_their_blocks() {
    let (engine, tok) = start(EngineConfig::default(), 1024);
    let mut streams: Vec<TokenStream> = (0..20)
        .map(|i| {
            let prompt = encode(&tok, &format!("{} number {i}", PROMPTS[i % 4]));
            submit(&engine, prompt, 500, Priority::Interactive)
        })
        .collect();
    for s in streams.iter_mut() {
        assert!(matches!(s.blocking_recv(), Some(TokenEvent::Token { .. })));
    }
    wait_until("the running sequences hold blocks", || {
        engine.kv_blocks().0 > 0
    });
    drop(streams);
    wait_until("every block is back", || {
        engine.kv_blocks().0 == 0 && engine.active_sequences() == 0
    });
    let (ids, n) = collect(submit(
        &engine,
        encode(&tok, PROMPTS[0]),
        5,
        Priority::Interactive,
    ));
    assert_eq!((ids.len(), n), (5, 5));
}

/// 64 concurrent streams with distinct prompts: each gets exactly its
/// token count, and its tokens equal the same prompt's tokens run alone
/// (so nothing was lost, duplicated or crossed between streams).
#[test]
fn sixty_four_concurrent_streams_each_get_their_own_tokens() {
    let (engine, tok) = start(EngineConfig::default(), 1024);
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|i| encode(&tok, &format!("{} (case {i}):", PROMPTS[i % 4])))
        .collect();
    let streams: Vec<TokenStream> = prompts
        .iter()
        .map(|p| submit(&engine, p.clone(), 8, Priority::Interactive))
        .collect();
    let results: Vec<(Vec<u32>, usize)> = streams.into_iter().map(collect).collect();
    for (i, (ids, n)) in results.iter().enumerate() {
        assert_eq!((ids.len(), *n), (8, 8), "stream {i}");
    }
    for i in [0, 13, 42, 63] {
        assert_eq!(
            results[i].0,
            generate(&engine, prompts[i].clone(), 8),
            "stream {i}"
        );
    }
    wait_until("the pool is empty", || engine.kv_blocks().0 == 0);
}
