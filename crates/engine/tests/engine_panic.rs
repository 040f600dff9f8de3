//! A panic inside an engine turn (here: sampling from logits that a broken
//! model did not return) ends every sequence with an error and marks the
//! engine dead, instead of silently leaving clients waiting forever.

mod common;

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use hearth_core::{GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::load::load_gguf;
use hearth_engine::{EngineConfig, EngineHandle, EngineParts};
use hearth_models::{CausalLM, KvCache, KvPool, ModelInfo, PagedSeq};

/// The real model, except that its batched forward returns no rows.
struct Rowless(Box<dyn CausalLM>);

impl CausalLM for Rowless {
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> candle_core::Result<Tensor> {
        self.0.forward(tokens, cache)
    }

    fn forward_paged(
        &self,
        _seqs: &[PagedSeq<'_>],
        _pool: &mut KvPool,
    ) -> candle_core::Result<Tensor> {
        Tensor::zeros((0, self.0.info().vocab_size), DType::F32, &Device::Cpu)
    }

    fn info(&self) -> &ModelInfo {
        self.0.info()
    }

    fn new_cache(&self) -> KvCache {
        self.0.new_cache()
    }

    fn new_pool(&self, num_blocks: usize) -> candle_core::Result<KvPool> {
        self.0.new_pool(num_blocks)
    }

    fn kv_dtype(&self) -> DType {
        self.0.kv_dtype()
    }
}

#[test]
fn a_panic_in_a_turn_fails_the_sequences_and_marks_the_engine_dead() {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let engine = EngineHandle::start(
        EngineParts {
            model: Box::new(Rowless(lm.model)),
            tokenizer: Arc::new(lm.tokenizer),
            eos_ids: lm.eos_ids,
            context_length: 512,
        },
        EngineConfig::default(),
    )
    .unwrap();
    assert!(engine.is_alive());
    let request = GenerateRequest {
        id: "doomed".into(),
        prompt_ids: vec![1, 2, 3, 4],
        params: SamplingParams {
            max_tokens: Some(4),
            ..SamplingParams::greedy()
        },
        priority: Priority::Interactive,
        adapter: None,
        cache_scope: None,
        constraint: None,
    };
    let mut stream = engine.submit(request.clone()).unwrap();
    let event = stream
        .blocking_recv()
        .expect("an event, not a dropped channel");
    match event {
        TokenEvent::Error(e) => assert!(e.to_string().contains("panic"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let started = std::time::Instant::now();
    while engine.is_alive() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never marked dead"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // New work is refused at once rather than queued forever.
    let started = std::time::Instant::now();
    loop {
        match engine.submit(request.clone()) {
            Err(_) => break,
            Ok(mut s) => assert!(s
                .blocking_recv()
                .is_none_or(|e| matches!(e, TokenEvent::Error(_)))),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still accepting work"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
