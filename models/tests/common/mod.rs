//! Test support: the tiny random-weight Llama (2 layers, hidden 64, 4/2
//! heads, vocab 100, context 32) and a logits comparison.

#![allow(dead_code)]

pub mod gguf;
pub mod quant_error;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use hearth_models::{Llama, LlamaConfig};

pub const TOL: f32 = 1e-4;

pub fn tiny_config(tie: bool) -> LlamaConfig {
    serde_json::from_value(serde_json::json!({
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32,
        "vocab_size": 100,
        "tie_word_embeddings": tie,
    }))
    .expect("valid config")
}

/// With the default (f16) KV cache.
pub fn tiny_model_f16_cache(tie: bool) -> Result<Llama> {
    tiny_model_weights(tie, false)
}

/// As [`tiny_model_f16_cache`], with the weights from [`reseed`]'s fixed
/// seed: the same model in every run, for comparisons whose f16 rounding
/// would otherwise now and then land a value on a boundary in one path
/// and not the other.
pub fn tiny_model_f16_cache_seeded(tie: bool) -> Result<Llama> {
    tiny_model_weights(tie, true)
}

/// The tiny Llama with fresh random weights, or with `seeded` those of
/// [`reseed`].
fn tiny_model_weights(tie: bool, seeded: bool) -> Result<Llama> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    if !tie {
        // VarMap only knows names once they are requested: create the head.
        vb.get_with_hints(
            (100, 64),
            "lm_head.weight",
            candle_nn::init::DEFAULT_KAIMING_NORMAL,
        )?;
    }
    let model = Llama::from_safetensors(&tiny_config(tie), vb.clone())?;
    if !seeded {
        return Ok(model);
    }
    // The first load created every other weight in the VarMap.
    reseed(&varmap)?;
    Llama::from_safetensors(&tiny_config(tie), vb)
}

/// With an f32 KV cache, which keeps every path exact to f32 rounding, so
/// the 1e-4 tolerance is meaningful.
pub fn tiny_model(tie: bool) -> Result<Llama> {
    tiny_model_f16_cache(tie)?.with_kv_dtype(DType::F32)
}

/// Replaces every variable of `varmap` (the tiny Llama's, as created by
/// a first load) with values from a fixed seed, at the scales of their
/// random initialisation: norm weights 1 +- 0.2 (as the tests ask for),
/// embeddings of standard deviation 1, other matrices sqrt(2 / fan-in)
/// (candle's Kaiming-normal default). The same weights in every run:
/// tests whose paths quantize activations to 8 bits need that, since with
/// fresh random weights a value now and then lands on a rounding boundary
/// in one path and not the other, and a comparison meant for f32 rounding
/// fails (a few runs in a hundred).
pub fn reseed(varmap: &VarMap) -> Result<()> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let vars = varmap.data().lock().expect("varmap lock");
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let var = &vars[name];
        let t = var.as_tensor();
        let (mean, std) = match t.dims() {
            [_] => (1.0, 0.2),
            _ if name.contains("embed_tokens") => (0.0, 1.0),
            [.., fan_in] => (0.0, (2.0 / *fan_in as f32).sqrt()),
            [] => (0.0, 1.0),
        };
        let values = seeded_uniform(&mut state, t.elem_count(), mean, std);
        var.set(&Tensor::from_vec(values, t.shape(), t.device())?)?;
    }
    Ok(())
}

/// `n` values uniform with mean `mean` and standard deviation `std`, from
/// the xorshift generator `state` (advanced).
pub fn seeded_uniform(state: &mut u64, n: usize, mean: f32, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            let u = (*state >> 40) as f32 / (1u64 << 24) as f32;
            // Uniform on [-sqrt 3, sqrt 3) has variance 1.
            mean + (2.0 * u - 1.0) * 3f32.sqrt() * std
        })
        .collect()
}

/// Largest absolute difference between two tensors of the same shape.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The first CUDA device, or `None` after saying the test is skipped (a
/// machine without one).
#[cfg(feature = "cuda")]
pub fn cuda() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}
