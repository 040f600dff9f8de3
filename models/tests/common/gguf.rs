//! Writing a tiny Hugging Face Llama (its VarMap tensors) as a GGUF file in
//! memory, the way llama.cpp's converter does: names mapped, q/k rows
//! permuted for adjacent-pair rotary.

use std::io::Cursor;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Result, Tensor};
use hearth_models::Llama;

/// llama.cpp `convert_hf_to_gguf.py` `permute`: per head, rows `(2, d/2)`
/// become `(d/2, 2)`, turning HF's halves pairing into adjacent pairs.
pub fn permute(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    w.reshape((heads, 2, out / heads / 2, inp))?
        .transpose(1, 2)?
        .reshape((out, inp))
}

/// The GGUF name of a Hugging Face Llama tensor.
pub fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let part = match rest {
        "input_layernorm.weight" => "attn_norm",
        "post_attention_layernorm.weight" => "ffn_norm",
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{part}.weight"))
}

/// Sizes written into the GGUF metadata.
pub struct GgufShape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: usize,
    pub theta: f64,
}

/// Hugging Face tensors (name, f32 value) -> GGUF bytes with every matrix
/// stored as `matrix_dtype`.
pub fn write_gguf(
    tensors: &[(String, Tensor)],
    s: &GgufShape,
    matrix_dtype: GgmlDType,
) -> Result<Vec<u8>> {
    let mut q = Vec::new();
    for (name, t) in tensors {
        let Some(gname) = gguf_name(name) else {
            panic!("unmapped tensor {name}")
        };
        let dtype = if t.rank() == 2 {
            matrix_dtype
        } else {
            GgmlDType::F32
        };
        let stored = if gname.ends_with("attn_q.weight") {
            permute(t, s.heads)?
        } else if gname.ends_with("attn_k.weight") {
            permute(t, s.kv_heads)?
        } else {
            t.clone()
        };
        q.push((gname, QTensor::quantize(&stored, dtype)?));
    }
    let u32v = |v: usize| Value::U32(v as u32);
    let metadata = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.context_length", u32v(s.context)),
        ("llama.embedding_length", u32v(s.hidden)),
        ("llama.block_count", u32v(s.layers)),
        ("llama.feed_forward_length", u32v(s.intermediate)),
        ("llama.attention.head_count", u32v(s.heads)),
        ("llama.attention.head_count_kv", u32v(s.kv_heads)),
        ("llama.rope.dimension_count", u32v(s.hidden / s.heads)),
        ("llama.rope.freq_base", Value::F32(s.theta as f32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let mut file = Cursor::new(Vec::new());
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md, &ts)?;
    Ok(file.into_inner())
}

/// Loads GGUF bytes as a model.
pub fn load_gguf(bytes: Vec<u8>) -> Result<Llama> {
    let mut file = Cursor::new(bytes);
    let content = gguf_file::Content::read(&mut file)?;
    Llama::from_gguf(&content, &mut file, &Device::Cpu)
}
