//! `forward_batch`: several sequences, each at its own cache length and with
//! its own chunk size, in one flattened pass must give the same logits and
//! leave the same caches as running each sequence alone through `forward`;
//! bad inputs fail before any cache moves. Tiny random-weight Llama with an
//! f32 KV cache (exact to f32 rounding), as in `llama_tiny.rs`.

mod common;

use candle_core::{DType, Result, Tensor};
use common::{max_diff, tiny_model, TOL};
use hearth_models::{CausalLM, KvCache, Llama, ModelInfo, SeqStep};

/// Prefixes already in the caches, and the chunk each sequence runs next:
/// a 1-token decode after 7 cached tokens, a 5-token prefill chunk after 4,
/// a 1-token decode after 2 (the prefill sits in the middle of the batch).
const PREFIXES: [&[u32]; 3] = [&[3, 17, 42, 99, 0, 56, 8], &[23, 71, 5, 64], &[11, 12]];
const CHUNKS: [&[u32]; 3] = [&[31], &[9, 88, 2, 47, 60], &[77]];

fn prefilled(model: &impl CausalLM) -> Result<Vec<KvCache>> {
    PREFIXES
        .iter()
        .map(|p| {
            let mut c = model.new_cache();
            model.forward(p, &mut c)?;
            Ok(c)
        })
        .collect()
}

fn steps<'a>(chunks: &[&'a [u32]], caches: &'a mut [KvCache]) -> Vec<SeqStep<'a>> {
    chunks
        .iter()
        .zip(caches.iter_mut())
        .map(|(&tokens, cache)| SeqStep { tokens, cache })
        .collect()
}

/// Checks `model.forward_batch` against per-sequence `forward` calls, then
/// two more single-token steps on each side.
fn check_batch_matches_separate(model: &impl CausalLM) -> Result<()> {
    let mut alone = prefilled(model)?;
    let want: Vec<Tensor> = CHUNKS
        .iter()
        .zip(alone.iter_mut())
        .map(|(c, cache)| model.forward(c, cache))
        .collect::<Result<_>>()?;

    let mut batched = prefilled(model)?;
    let got = model.forward_batch(&mut steps(&CHUNKS, &mut batched))?;
    assert_eq!(got.dims(), &[3, 100]);
    assert_eq!(got.dtype(), DType::F32);
    for (i, w) in want.iter().enumerate() {
        let d = max_diff(&got.get(i)?, w);
        assert!(d < TOL, "sequence {i}: batched logits differ by {d}");
    }
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a.len(), b.len(), "sequence {i} cache length");
        assert_eq!(b.len(), PREFIXES[i].len() + CHUNKS[i].len());
    }

    // The caches hold the same keys/values: later steps agree, both single
    // forwards on the batched caches and another batched step.
    for (i, (a, b)) in alone.iter_mut().zip(batched.iter_mut()).enumerate() {
        let t = [40 + i as u32];
        let d = max_diff(&model.forward(&t, a)?, &model.forward(&t, b)?);
        assert!(d < TOL, "sequence {i}: next single step differs by {d}");
    }
    let next: [&[u32]; 3] = [&[1], &[2, 3], &[4]];
    let want: Vec<Tensor> = next
        .iter()
        .zip(alone.iter_mut())
        .map(|(c, cache)| model.forward(c, cache))
        .collect::<Result<_>>()?;
    let got = model.forward_batch(&mut steps(&next, &mut batched))?;
    for (i, w) in want.iter().enumerate() {
        let d = max_diff(&got.get(i)?, w);
        assert!(d < TOL, "sequence {i}: second batched step differs by {d}");
    }
    Ok(())
}

#[test]
fn batch_of_mixed_prefill_and_decode_matches_separate_forwards() -> Result<()> {
    for tie in [true, false] {
        check_batch_matches_separate(&tiny_model(tie)?)?;
    }
    Ok(())
}

#[test]
fn batch_of_one_equals_forward() -> Result<()> {
    let model = tiny_model(true)?;
    for chunk in [&[5u32, 6, 7][..], &[8]] {
        let mut a = model.new_cache();
        let mut b = model.new_cache();
        model.forward(&[1, 2], &mut a)?;
        model.forward(&[1, 2], &mut b)?;
        let want = model.forward(chunk, &mut a)?;
        let got = model.forward_batch(&mut [SeqStep {
            tokens: chunk,
            cache: &mut b,
        }])?;
        assert_eq!(got.dims(), &[1, 100]);
        let d = max_diff(&got.squeeze(0)?, &want);
        assert!(d < TOL, "batch of one differs by {d}");
        assert_eq!(a.len(), b.len());
    }
    Ok(())
}

/// Every kind of bad input in one sequence fails the whole batch before any
/// cache moves, and the batch then runs normally once fixed.
fn check_bad_inputs_leave_caches(model: &impl CausalLM) -> Result<()> {
    let mut caches = prefilled(model)?;
    let lens: Vec<usize> = caches.iter().map(KvCache::len).collect();
    let long = [1u32; 30]; // 4 cached + 30 > context of 32
    let bad_cases: [[&[u32]; 3]; 3] = [
        [&[31], &[9, 88, 100, 47], &[77]], // token id == vocab
        [&[31], &long, &[77]],             // past the context
        [&[31], &[9], &[]],                // empty chunk
    ];
    for chunks in &bad_cases {
        assert!(model
            .forward_batch(&mut steps(chunks, &mut caches))
            .is_err());
        let now: Vec<usize> = caches.iter().map(KvCache::len).collect();
        assert_eq!(now, lens, "cache lengths moved on {chunks:?}");
    }
    assert!(model.forward_batch(&mut []).is_err());

    // Still usable, and equal to a clean run.
    let got = model.forward_batch(&mut steps(&CHUNKS, &mut caches))?;
    let mut clean = prefilled(model)?;
    let want = model.forward_batch(&mut steps(&CHUNKS, &mut clean))?;
    let d = max_diff(&got, &want);
    assert!(d < TOL, "batch after failed ones differs by {d}");
    Ok(())
}

#[test]
fn bad_input_in_one_sequence_fails_without_moving_caches() -> Result<()> {
    check_bad_inputs_leave_caches(&tiny_model(true)?)
}

/// A model that only implements `forward`, so `forward_batch` is the
/// trait's default loop.
struct ForwardOnly(Llama);

impl CausalLM for ForwardOnly {
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.0.forward(tokens, cache)
    }
    fn info(&self) -> &ModelInfo {
        self.0.info()
    }
    fn new_cache(&self) -> KvCache {
        self.0.new_cache()
    }
}

#[test]
fn default_forward_batch_loops_over_forward() -> Result<()> {
    let model = ForwardOnly(tiny_model(false)?);
    check_batch_matches_separate(&model)?;
    check_bad_inputs_leave_caches(&model)
}
