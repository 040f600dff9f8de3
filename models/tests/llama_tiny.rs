//! Tiny random-weight Llama built through a `VarMap`: checks that chunked
//! prefill, decoding through the cache and a full-sequence forward agree, that
//! the causal mask holds, and that bad inputs fail cleanly.

mod common;

use candle_core::{DType, Result};
use common::{max_diff, tiny_model, tiny_model_f16_cache, TOL};
use hearth_models::CausalLM;

const SEQ: [u32; 10] = [3, 17, 42, 99, 0, 56, 8, 23, 71, 5];

#[test]
fn full_chunked_and_token_by_token_agree() -> Result<()> {
    for tie in [true, false] {
        let model = tiny_model(tie)?;
        let mut cache = model.new_cache();
        let full = model.forward(&SEQ, &mut cache)?;
        assert_eq!(full.dims(), &[100]);
        assert_eq!(full.dtype(), DType::F32);
        assert_eq!(cache.len(), 10);
        assert!(
            full.abs()?.max_all()?.to_scalar::<f32>()? > 1e-2,
            "logits are not trivial"
        );

        // 6-token prompt, then 4 single tokens through the cache.
        let mut cache = model.new_cache();
        model.forward(&SEQ[..6], &mut cache)?;
        let mut last = None;
        for &t in &SEQ[6..] {
            last = Some(model.forward(&[t], &mut cache)?);
        }
        let d = max_diff(&full, &last.unwrap());
        assert!(d < TOL, "prompt + decode differs by {d} (tie={tie})");

        // Token by token from the start.
        let mut cache = model.new_cache();
        let mut last = None;
        for &t in &SEQ {
            last = Some(model.forward(&[t], &mut cache)?);
        }
        assert_eq!(cache.len(), 10);
        let d = max_diff(&full, &last.unwrap());
        assert!(d < TOL, "token by token differs by {d} (tie={tie})");

        // Uneven chunks 3 + 5 + 2.
        let mut cache = model.new_cache();
        model.forward(&SEQ[..3], &mut cache)?;
        model.forward(&SEQ[3..8], &mut cache)?;
        let chunked = model.forward(&SEQ[8..], &mut cache)?;
        let d = max_diff(&full, &chunked);
        assert!(d < TOL, "3+5+2 chunks differ by {d} (tie={tie})");
    }
    Ok(())
}

/// The default f16 cache: chunked and token-by-token runs see the same
/// rounded keys/values except where a last-bit f32 difference flips an f16
/// rounding, so they agree to f16 precision (logits here are of order 10).
#[test]
fn f16_cache_agrees_across_chunkings() -> Result<()> {
    let model = tiny_model_f16_cache(true)?;
    let mut cache = model.new_cache();
    assert_eq!(cache.dtype(), DType::F16, "f16 is the default");
    let full = model.forward(&SEQ, &mut cache)?;
    let mut cache = model.new_cache();
    model.forward(&SEQ[..6], &mut cache)?;
    let mut last = None;
    for &t in &SEQ[6..] {
        last = Some(model.forward(&[t], &mut cache)?);
    }
    let d = max_diff(&full, &last.unwrap());
    assert!(d < 2e-2, "f16 cache: prompt + decode differs by {d}");
    Ok(())
}

#[test]
fn cleared_cache_is_reusable() -> Result<()> {
    let model = tiny_model(true)?;
    let mut cache = model.new_cache();
    let first = model.forward(&SEQ, &mut cache)?;
    // Fill it with something else, past its first capacity, then clear.
    cache.clear();
    assert!(cache.is_empty());
    let other: Vec<u32> = (0..30).map(|i| (i * 7 % 100) as u32).collect();
    model.forward(&other, &mut cache)?;
    cache.clear();
    model.forward(&SEQ[..4], &mut cache)?;
    let again = model.forward(&SEQ[4..], &mut cache)?;
    let d = max_diff(&first, &again);
    assert!(d < TOL, "reused cache differs by {d}");

    // truncate() rolls back to a prefix.
    cache.truncate(6);
    let mut last = None;
    for &t in &SEQ[6..] {
        last = Some(model.forward(&[t], &mut cache)?);
    }
    let d = max_diff(&first, &last.unwrap());
    assert!(d < TOL, "truncated cache differs by {d}");
    Ok(())
}

#[test]
fn bad_inputs_are_errors() -> Result<()> {
    let model = tiny_model(true)?;
    let mut cache = model.new_cache();
    assert!(model.forward(&[1, 100], &mut cache).is_err());
    assert!(model.forward(&[u32::MAX], &mut cache).is_err());
    assert!(model.forward(&[], &mut cache).is_err());
    assert_eq!(
        cache.len(),
        0,
        "a failed forward must not advance the cache"
    );

    // Context length is 32: 30 + 2 fits, one more does not.
    let ids: Vec<u32> = (0..30).collect();
    model.forward(&ids, &mut cache)?;
    model.forward(&[1, 2], &mut cache)?;
    assert_eq!(cache.len(), 32);
    assert!(model.forward(&[1], &mut cache).is_err());
    assert_eq!(cache.len(), 32);
    let too_long: Vec<u32> = (0..33).map(|i| i % 100).collect();
    assert!(model.forward(&too_long, &mut model.new_cache()).is_err());
    Ok(())
}

/// Logits at position 4 depend only on tokens 0..=4: whatever follows in the
/// same chunk must not leak into them.
#[test]
fn causal_mask_hides_later_tokens() -> Result<()> {
    let model = tiny_model(false)?;
    let prefix = model.forward(&SEQ[..5], &mut model.new_cache())?;

    let mut altered = SEQ;
    altered[5] = 11;
    altered[9] = 77;
    let full_a = model.forward(&SEQ, &mut model.new_cache())?;
    let full_b = model.forward(&altered, &mut model.new_cache())?;
    assert!(
        max_diff(&full_a, &full_b) > 1e-3,
        "later tokens should change the last logits"
    );

    // Prefill all 10 tokens in one chunk, then truncate to 4 and re-decode
    // token 4. Its logits read the layer-1 keys/values of positions 0..4,
    // which the chunk computed from masked layer-0 attention: they must not
    // have seen tokens 5..9, whatever those are.
    for seq in [SEQ, altered] {
        let mut cache = model.new_cache();
        model.forward(&seq, &mut cache)?;
        cache.truncate(4);
        let at4 = model.forward(&seq[4..5], &mut cache)?;
        let d = max_diff(&prefix, &at4);
        assert!(
            d < TOL,
            "prefix logits changed by {d} when later tokens changed"
        );
    }
    Ok(())
}
