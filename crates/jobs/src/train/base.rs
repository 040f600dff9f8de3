//! The frozen base model's weights as plain f32 tensors (no `Var`s, so
//! autograd never computes gradients for them), read from a llama GGUF file
//! (every matrix dequantised with `QTensor::dequantize`, q/k rows kept in
//! GGUF's permuted layout, interleaved RoPE) or a Hugging Face safetensors
//! folder (halves RoPE).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use hearth_models::{LlamaConfig, LoraTarget};

use super::ops::RopeLayout;
use crate::TrainError;

/// Sizes of a Llama model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// The model's own context length (the RoPE tables cover it).
    pub context: usize,
}

/// One block's frozen weights; `linears` in [`LoraTarget::ALL`] order, each
/// `[out, in]`.
pub(crate) struct LayerWeights {
    pub attn_norm: Tensor,
    pub ffn_norm: Tensor,
    pub linears: [Tensor; 7],
}

/// The frozen base.
pub(crate) struct BaseWeights {
    pub dims: Dims,
    pub eps: f64,
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor,
    pub lm_head: Tensor,
    /// `[context, head_dim / 2]` each.
    pub cos: Tensor,
    pub sin: Tensor,
    pub layout: RopeLayout,
}

fn err(m: impl Into<String>) -> TrainError {
    TrainError::Model(m.into())
}

pub(crate) fn rope_tables(
    inv_freq: &[f64],
    len: usize,
    dev: &Device,
) -> Result<(Tensor, Tensor), TrainError> {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..len {
        for &f in inv_freq {
            let a = pos as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    let half = inv_freq.len();
    Ok((
        Tensor::from_vec(cos, (len, half), dev)?,
        Tensor::from_vec(sin, (len, half), dev)?,
    ))
}

fn inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64))
        .collect()
}

impl BaseWeights {
    fn check(&self) -> Result<(), TrainError> {
        let d = &self.dims;
        let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        if d.heads == 0
            || d.kv_heads == 0
            || !d.heads.is_multiple_of(d.kv_heads)
            || !d.head_dim.is_multiple_of(2)
        {
            return Err(err(format!(
                "{} heads / {} kv heads of {} do not form a Llama",
                d.heads, d.kv_heads, d.head_dim
            )));
        }
        if self.embed.dims2()? != (d.vocab, d.hidden)
            || self.lm_head.dims2()? != (d.vocab, d.hidden)
        {
            return Err(err("embedding or output head shape mismatch"));
        }
        for (i, l) in self.layers.iter().enumerate() {
            for (t, w) in LoraTarget::ALL.iter().zip(&l.linears) {
                let want = t.features_of(d.hidden, q, kv, d.intermediate);
                if w.dims2()? != want {
                    return Err(err(format!(
                        "layer {i} {}: shape {:?}, expected {want:?}",
                        t.peft_name(),
                        w.shape()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Reads a llama GGUF file; every tensor dequantised to f32.
    pub fn from_gguf(path: &Path) -> Result<Self, TrainError> {
        let dev = Device::Cpu;
        let mut file = std::fs::File::open(path)
            .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        let c = Content::read(&mut file)
            .map_err(|e| err(format!("{} is not a GGUF file: {e}", path.display())))?;
        let arch = match c.metadata.get("general.architecture") {
            Some(Value::String(s)) => s.clone(),
            _ => "llama".into(),
        };
        if arch != "llama" {
            return Err(err(format!("gguf architecture {arch:?} is not a llama")));
        }
        let num = |k: &str| -> Option<f64> {
            match c.metadata.get(&format!("{arch}.{k}"))? {
                Value::U8(x) => Some(*x as f64),
                Value::I8(x) => Some(*x as f64),
                Value::U16(x) => Some(*x as f64),
                Value::I16(x) => Some(*x as f64),
                Value::U32(x) => Some(*x as f64),
                Value::I32(x) => Some(*x as f64),
                Value::U64(x) => Some(*x as f64),
                Value::I64(x) => Some(*x as f64),
                Value::F32(x) => Some(*x as f64),
                Value::F64(x) => Some(*x),
                _ => None,
            }
        };
        let req = |k: &str| {
            num(k)
                .map(|v| v as usize)
                .ok_or_else(|| err(format!("gguf metadata {k} missing")))
        };
        let hidden = req("embedding_length")?;
        let layers = req("block_count")?;
        let heads = req("attention.head_count")?;
        let kv_heads = num("attention.head_count_kv").map_or(heads, |v| v as usize);
        let context = req("context_length")?;
        let head_dim = num("attention.key_length").map_or(hidden / heads.max(1), |v| v as usize);
        let theta = num("rope.freq_base").unwrap_or(10000.0);
        let eps = num("attention.layer_norm_rms_epsilon").unwrap_or(1e-5);
        if c.metadata
            .contains_key(&format!("{arch}.rope.scaling.type"))
            || c.tensor_infos.contains_key("rope_freqs.weight")
        {
            return Err(err("RoPE scaling is not supported by the trainer"));
        }
        if num("rope.dimension_count").is_some_and(|r| r as usize != head_dim) {
            return Err(err("partial rotary is not supported"));
        }
        let mut get = |name: &str| -> Result<Tensor, TrainError> {
            let q = c.tensor(&mut file, name, &dev)?;
            Ok(q.dequantize(&dev)?.to_dtype(DType::F32)?)
        };
        let embed = get("token_embd.weight")?;
        let vocab = embed.dim(0)?;
        let lm_head = if c.tensor_infos.contains_key("output.weight") {
            get("output.weight")?
        } else {
            embed.clone()
        };
        let norm = get("output_norm.weight")?;
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let p = format!("blk.{i}");
            for part in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                if c.tensor_infos.contains_key(&format!("{p}.{part}.bias")) {
                    return Err(err("linear biases are not supported by the trainer"));
                }
            }
            let mut lin = |n: &str| get(&format!("{p}.{n}.weight"));
            let linears = [
                lin("attn_q")?,
                lin("attn_k")?,
                lin("attn_v")?,
                lin("attn_output")?,
                lin("ffn_gate")?,
                lin("ffn_up")?,
                lin("ffn_down")?,
            ];
            blocks.push(LayerWeights {
                attn_norm: get(&format!("{p}.attn_norm.weight"))?,
                ffn_norm: get(&format!("{p}.ffn_norm.weight"))?,
                linears,
            });
        }
        let intermediate = blocks
            .first()
            .map_or(0, |b| b.linears[4].dim(0).unwrap_or(0));
        let (cos, sin) = rope_tables(&inv_freq(head_dim, theta), context, &dev)?;
        let base = Self {
            dims: Dims {
                hidden,
                intermediate,
                layers,
                heads,
                kv_heads,
                head_dim,
                vocab,
                context,
            },
            eps,
            embed,
            layers: blocks,
            norm,
            lm_head,
            cos,
            sin,
            layout: RopeLayout::Interleaved,
        };
        base.check()?;
        Ok(base)
    }

    /// Reads a Hugging Face folder: `config.json` and `*.safetensors`.
    pub fn from_safetensors(dir: &Path) -> Result<Self, TrainError> {
        let dev = Device::Cpu;
        let cfg_bytes = std::fs::read(dir.join("config.json"))
            .map_err(|e| err(format!("cannot read {}/config.json: {e}", dir.display())))?;
        let cfg: LlamaConfig =
            serde_json::from_slice(&cfg_bytes).map_err(|e| err(format!("config.json: {e}")))?;
        if cfg.attention_bias || cfg.mlp_bias || cfg.hidden_act != "silu" {
            return Err(err(
                "biases and activations other than silu are not supported",
            ));
        }
        let mut scale = 1.0;
        if let Some(s) = &cfg.rope_scaling {
            match s
                .rope_type
                .as_deref()
                .or(s.kind.as_deref())
                .unwrap_or("default")
            {
                "default" => {}
                "linear" => scale = s.factor,
                other => return Err(err(format!("rope_scaling {other:?} is not supported"))),
            }
        }
        let mut files: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(err(format!("no .safetensors files in {}", dir.display())));
        }
        let mut t: HashMap<String, Tensor> = HashMap::new();
        for f in &files {
            t.extend(candle_core::safetensors::load(f, &dev)?);
        }
        let mut get = |name: &str| -> Result<Tensor, TrainError> {
            t.remove(name)
                .ok_or_else(|| err(format!("tensor {name} missing")))?
                .to_dtype(DType::F32)
                .map_err(Into::into)
        };
        let embed = get("model.embed_tokens.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight").unwrap_or_else(|_| embed.clone())
        };
        let norm = get("model.norm.weight")?;
        let mut blocks = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |tg: LoraTarget| get(&format!("{p}.{}.weight", tg.module_path()));
            let linears = [
                lin(LoraTarget::Q)?,
                lin(LoraTarget::K)?,
                lin(LoraTarget::V)?,
                lin(LoraTarget::O)?,
                lin(LoraTarget::Gate)?,
                lin(LoraTarget::Up)?,
                lin(LoraTarget::Down)?,
            ];
            blocks.push(LayerWeights {
                attn_norm: get(&format!("{p}.input_layernorm.weight"))?,
                ffn_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
                linears,
            });
        }
        let head_dim = cfg.head_dim();
        let freqs: Vec<f64> = inv_freq(head_dim, cfg.rope_theta)
            .into_iter()
            .map(|f| f / scale)
            .collect();
        let (cos, sin) = rope_tables(&freqs, cfg.max_position_embeddings, &dev)?;
        let base = Self {
            dims: Dims {
                hidden: cfg.hidden_size,
                intermediate: cfg.intermediate_size,
                layers: cfg.num_hidden_layers,
                heads: cfg.num_attention_heads,
                kv_heads: cfg.num_kv_heads(),
                head_dim,
                vocab: cfg.vocab_size,
                context: cfg.max_position_embeddings,
            },
            eps: cfg.rms_norm_eps,
            embed,
            layers: blocks,
            norm,
            lm_head,
            cos,
            sin,
            layout: RopeLayout::Halves,
        };
        base.check()?;
        Ok(base)
    }
}
