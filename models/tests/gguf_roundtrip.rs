//! The GGUF loader against the safetensors loader: a tiny random Llama in
//! Hugging Face layout is written out as a GGUF file the way llama.cpp's
//! converter does it (renamed tensors, Q/K rows permuted for GGML's
//! adjacent-pair rotary, f32 or quantized matrices), read back with
//! `Llama::from_gguf`, and both models must give the same logits. This checks
//! tensor names, metadata keys, the RoPE layouts and the tied head.

mod common;

use std::io::Cursor;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result};
use candle_nn::{Init, VarBuilder, VarMap};
use common::gguf::{gguf_name, permute};
use common::max_diff;
use hearth_models::{CausalLM, Llama, LlamaConfig, PagedSeq};

/// Hidden and feed-forward sizes of the model (rows of 64 and 96 values:
/// the 32-value block formats).
const DIMS: Dims = Dims {
    hidden: 64,
    intermediate: 96,
};
/// Sizes whose rows are whole 256-value super-blocks, for the K-quants.
const K_DIMS: Dims = Dims {
    hidden: 256,
    intermediate: 512,
};
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const VOCAB: usize = 100;
const CONTEXT: usize = 48;
const THETA: f64 = 100000.0;

#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    intermediate: usize,
}

fn config(tie: bool, dims: Dims) -> LlamaConfig {
    serde_json::from_value(serde_json::json!({
        "hidden_size": dims.hidden, "intermediate_size": dims.intermediate,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": THETA, "max_position_embeddings": CONTEXT,
        "vocab_size": VOCAB, "tie_word_embeddings": tie,
    }))
    .expect("valid config")
}

/// Both models from the same random weights. The GGUF stores its matrices
/// (the embedding too, like the real file's Q8_0) as `matrix_dtype`; the
/// safetensors model then gets the dequantized values, so that the two differ
/// only in how the matmuls round their activations. (Quantization works row
/// by row, so it commutes with the Q/K row permutation.)
fn both_models(tie: bool, matrix_dtype: GgmlDType) -> Result<(Llama, Llama)> {
    let (hf, bytes) = hf_and_gguf(tie, matrix_dtype, DIMS)?;
    Ok((hf, load_gguf(bytes)?))
}

/// The safetensors model and the GGUF file's bytes (see [`both_models`]).
fn hf_and_gguf(tie: bool, matrix_dtype: GgmlDType, dims: Dims) -> Result<(Llama, Vec<u8>)> {
    let hidden = dims.hidden;
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    // Non-trivial norm scales, so that swapped norms would show.
    let scale = Init::Randn {
        mean: 1.0,
        stdev: 0.2,
    };
    vb.get_with_hints(hidden, "model.norm.weight", scale)?;
    for i in 0..LAYERS {
        vb.get_with_hints(
            hidden,
            &format!("model.layers.{i}.input_layernorm.weight"),
            scale,
        )?;
        vb.get_with_hints(
            hidden,
            &format!("model.layers.{i}.post_attention_layernorm.weight"),
            scale,
        )?;
    }
    if !tie {
        vb.get_with_hints(
            (VOCAB, hidden),
            "lm_head.weight",
            candle_nn::init::DEFAULT_KAIMING_NORMAL,
        )?;
    }
    // A first load creates every other weight in the VarMap.
    Llama::from_safetensors(&config(tie, dims), vb.clone())?;
    common::reseed(&varmap)?;

    let mut tensors = Vec::new();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let Some(gname) = gguf_name(name) else {
            panic!("unmapped tensor {name}")
        };
        let t = var.as_tensor().clone();
        let dtype = if t.rank() == 2 {
            matrix_dtype
        } else {
            GgmlDType::F32
        };
        let stored = if gname.ends_with("attn_q.weight") {
            permute(&t, HEADS)?
        } else if gname.ends_with("attn_k.weight") {
            permute(&t, KV_HEADS)?
        } else {
            t.clone()
        };
        tensors.push((gname, QTensor::quantize(&stored, dtype)?));
        var.set(&QTensor::quantize(&t, dtype)?.dequantize(&dev)?)?;
    }
    // In name order: the same file in every run.
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let hf = Llama::from_safetensors(&config(tie, dims), vb)?.with_kv_dtype(DType::F32)?;

    let u32v = |v: usize| Value::U32(v as u32);
    let metadata = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.context_length", u32v(CONTEXT)),
        ("llama.embedding_length", u32v(hidden)),
        ("llama.block_count", u32v(LAYERS)),
        ("llama.feed_forward_length", u32v(dims.intermediate)),
        ("llama.attention.head_count", u32v(HEADS)),
        ("llama.attention.head_count_kv", u32v(KV_HEADS)),
        ("llama.rope.dimension_count", u32v(hidden / HEADS)),
        ("llama.rope.freq_base", Value::F32(THETA as f32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let mut file = Cursor::new(Vec::new());
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md, &ts)?;
    Ok((hf, file.into_inner()))
}

fn load_gguf(bytes: Vec<u8>) -> Result<Llama> {
    let mut file = Cursor::new(bytes);
    let content = gguf_file::Content::read(&mut file)?;
    Llama::from_gguf(&content, &mut file, &Device::Cpu)?.with_kv_dtype(DType::F32)
}

const SEQ: [u32; 9] = [5, 61, 2, 99, 40, 17, 0, 33, 8];

#[test]
fn f32_gguf_matches_safetensors() -> Result<()> {
    for tie in [true, false] {
        let (hf, gguf) = both_models(tie, GgmlDType::F32)?;
        let (a, b) = (hf.info(), gguf.info());
        assert_eq!(
            (a.vocab_size, a.context_length, a.num_layers),
            (b.vocab_size, b.context_length, b.num_layers)
        );
        assert_eq!(
            (a.num_heads, a.num_kv_heads, a.head_dim),
            (b.num_heads, b.num_kv_heads, b.head_dim)
        );

        // A prompt chunk, then decode steps through the cache.
        let (mut ca, mut cb) = (hf.new_cache(), gguf.new_cache());
        let (la, lb) = (
            hf.forward(&SEQ[..5], &mut ca)?,
            gguf.forward(&SEQ[..5], &mut cb)?,
        );
        let d = max_diff(&la, &lb);
        assert!(d < 1e-4, "prefill logits differ by {d} (tie={tie})");
        for &t in &SEQ[5..] {
            let d = max_diff(&hf.forward(&[t], &mut ca)?, &gguf.forward(&[t], &mut cb)?);
            assert!(d < 1e-4, "decode logits differ by {d} (tie={tie})");
        }
    }
    Ok(())
}

/// Quantized matrices (Q8_0 through candle, Q4_1 through this crate's
/// kernel) against f32 math on the same dequantized weights: only the 8-bit
/// rounding of the matmul inputs (and f16 embedding rows) differs. In this
/// random, untrained net (fixed weights, `common::reseed`) that moves the
/// logits (spread 50 to 58) by 0.3 to 0.5, so the limit is 5% of the
/// spread; mismatched weights (e.g. the f32 originals against Q4_1) are off
/// by 20% or more.
#[test]
fn quantized_gguf_matches_dequantized_weights() -> Result<()> {
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
        let (hf, gguf) = both_models(true, dtype)?;
        let a = hf.forward(&SEQ, &mut hf.new_cache())?;
        let b = gguf.forward(&SEQ, &mut gguf.new_cache())?;
        let spread = (a.max_all()?.to_scalar::<f32>()? - a.min_all()?.to_scalar::<f32>()?).abs();
        let d = max_diff(&a, &b);
        assert!(
            d < 0.05 * spread,
            "{dtype:?}: logits differ by {d}, spread {spread}"
        );
    }
    Ok(())
}

/// The K-quants (rows of whole 256-value super-blocks, so a model of hidden
/// size 256) in every matrix, the tied embedding and head included: the
/// slice path against f32 math on the dequantized weights (the same 5% of
/// the logits' spread as above; with these weights the differences are
/// under 1%) and against the same file run through candle operations (the same
/// kernels: equal up to f32 rounding order).
#[test]
fn k_quant_gguf_matches_dequantized_weights_and_candle_ops() -> Result<()> {
    for dtype in [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
        let (hf, bytes) = hf_and_gguf(true, dtype, K_DIMS)?;
        let fast = load_gguf(bytes.clone())?;
        let slow = load_gguf(bytes)?.candle_ops_only();
        assert!(fast.runs_slice_path(), "{dtype:?}: not on the kernels");
        assert!(!slow.runs_slice_path());
        let a = hf.forward(&SEQ, &mut hf.new_cache())?;
        let b = fast.forward(&SEQ, &mut fast.new_cache())?;
        let c = slow.forward(&SEQ, &mut slow.new_cache())?;
        let spread = (a.max_all()?.to_scalar::<f32>()? - a.min_all()?.to_scalar::<f32>()?).abs();
        let d = max_diff(&a, &b);
        println!("{dtype:?}: logits differ by {d}, spread {spread}");
        assert!(
            d < 0.05 * spread,
            "{dtype:?}: logits differ by {d}, spread {spread}"
        );
        let d = max_diff(&b, &c);
        assert!(
            d <= 1e-4 * spread,
            "{dtype:?}: slice path and candle ops differ by {d}"
        );
    }
    Ok(())
}

#[test]
fn unsupported_architecture_is_an_error() -> Result<()> {
    let mut file = Cursor::new(Vec::new());
    let arch = Value::String("gpt2".into());
    gguf_file::write(&mut file, &[("general.architecture", &arch)], &[])?;
    file.set_position(0);
    let content = gguf_file::Content::read(&mut file)?;
    assert!(Llama::from_gguf(&content, &mut file, &Device::Cpu).is_err());
    Ok(())
}

/// The slice path of CPU models with kernel matrices (the default) against
/// the same model run through candle operations: prefill then one-token
/// steps through a cache, and a paged batch of three sequences at different
/// positions (a prefill chunk, a decode row, a chunk after a cached prefix).
/// Both use the same kernels, so they differ only in f32 rounding order,
/// and then only where a value sits on a rounding boundary of the 8-bit
/// activations (with the fixed weights of `common::reseed`, nowhere: the
/// outputs are identical).
#[test]
fn slice_path_matches_candle_ops() -> Result<()> {
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
        let (_, bytes) = hf_and_gguf(false, dtype, DIMS)?;
        let fast = load_gguf(bytes.clone())?;
        let slow = load_gguf(bytes)?.candle_ops_only();
        let close = |a: &candle_core::Tensor, b: &candle_core::Tensor, what: &str| {
            let spread = (a.max_all().unwrap().to_scalar::<f32>().unwrap()
                - a.min_all().unwrap().to_scalar::<f32>().unwrap())
            .abs();
            let d = max_diff(a, b);
            assert!(
                d <= 1e-4 * spread.max(1.0),
                "{dtype:?} {what}: differ by {d}"
            );
        };
        let (mut cf, mut cs) = (fast.new_cache(), slow.new_cache());
        close(
            &fast.forward(&SEQ, &mut cf)?,
            &slow.forward(&SEQ, &mut cs)?,
            "prefill",
        );
        for (i, tok) in [7u32, 3, 88].into_iter().enumerate() {
            let (a, b) = (
                fast.forward(&[tok], &mut cf)?,
                slow.forward(&[tok], &mut cs)?,
            );
            close(&a, &b, &format!("decode step {i}"));
        }

        let tables: [Vec<u32>; 3] = [vec![0], vec![1, 2], vec![3, 4]];
        let (mut pf, mut ps) = (fast.new_pool(5)?, slow.new_pool(5)?);
        // Cached prefixes first: 12 positions of the second sequence, 20 of
        // the third.
        let prefix: Vec<u32> = (0..20).map(|i| (i * 7 % 100) as u32).collect();
        for (model, pool) in [(&fast, &mut pf), (&slow, &mut ps)] {
            let seqs = [
                PagedSeq::new(&prefix[..12], 0, &tables[1]),
                PagedSeq::new(&prefix, 0, &tables[2]),
            ];
            model.forward_paged(&seqs, pool)?;
        }
        let batch = |model: &Llama, pool| {
            let seqs = [
                PagedSeq::new(&SEQ, 0, &tables[0]),
                PagedSeq::new(&SEQ[..1], 12, &tables[1]),
                PagedSeq::new(&SEQ[2..7], 20, &tables[2]),
            ];
            model.forward_paged(&seqs, pool)
        };
        close(
            &batch(&fast, &mut pf)?,
            &batch(&slow, &mut ps)?,
            "paged batch",
        );
    }
    Ok(())
}
