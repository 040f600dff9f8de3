//! Test support: the tiny random-weight Llama (2 layers, hidden 64, 4/2
//! heads, vocab 100, context 32) and a logits comparison.

#![allow(dead_code)]

pub mod gguf;

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
    Llama::from_safetensors(&tiny_config(tie), vb)
}

/// With an f32 KV cache, which keeps every path exact to f32 rounding, so
/// the 1e-4 tolerance is meaningful.
pub fn tiny_model(tie: bool) -> Result<Llama> {
    tiny_model_f16_cache(tie)?.with_kv_dtype(DType::F32)
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
