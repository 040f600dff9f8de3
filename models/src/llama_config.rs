//! A Llama model's Hugging Face `config.json` ([`LlamaConfig`]): shapes,
//! RoPE and its scaling, and the LoRA shapes a model of it takes.

use candle_core::{Device, Result};
use serde::Deserialize;

use crate::lora_apply::LoraSpec;
use crate::rotary::{inv_freq, inv_freq_llama3};
use crate::ModelInfo;

/// Hugging Face `config.json` of a Llama model (unknown fields are ignored).
#[derive(Deserialize, Debug, Clone)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no grouped-query attention).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    /// Only `"silu"` is supported.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
}

/// `rope_scaling` of a Hugging Face config: `"llama3"`, `"linear"` or
/// `"default"` (none).
#[derive(Deserialize, Debug, Clone)]
pub struct RopeScaling {
    #[serde(default)]
    pub rope_type: Option<String>,
    /// Older configs spell `rope_type` as `type`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default = "one")]
    pub factor: f64,
    #[serde(default = "one")]
    pub low_freq_factor: f64,
    #[serde(default = "four")]
    pub high_freq_factor: f64,
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_rope_theta() -> f64 {
    10000.0
}
fn default_hidden_act() -> String {
    "silu".to_string()
}
fn one() -> f64 {
    1.0
}
fn four() -> f64 {
    4.0
}

impl LlamaConfig {
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The shapes a LoRA adapter must fit to run on a model of this
    /// config ([`crate::CausalLM::lora_spec`] of the loaded model, on the
    /// CPU), without loading it.
    pub fn lora_spec(&self) -> LoraSpec {
        LoraSpec {
            info: ModelInfo {
                architecture: "llama".to_string(),
                vocab_size: self.vocab_size,
                context_length: self.max_position_embeddings,
                num_layers: self.num_hidden_layers,
                hidden_size: self.hidden_size,
                num_heads: self.num_attention_heads,
                num_kv_heads: self.num_kv_heads(),
                head_dim: self.head_dim(),
            },
            intermediate_size: self.intermediate_size,
            gguf_layout: false,
            device: Device::Cpu,
        }
    }

    /// RoPE inverse frequencies after `rope_scaling`.
    pub(crate) fn inv_freq(&self) -> Result<Vec<f64>> {
        let base = inv_freq(self.head_dim(), self.rope_theta);
        let Some(s) = &self.rope_scaling else {
            return Ok(base);
        };
        match s
            .rope_type
            .as_deref()
            .or(s.kind.as_deref())
            .unwrap_or("default")
        {
            "default" => Ok(base),
            "linear" => Ok(base.iter().map(|f| f / s.factor).collect()),
            "llama3" => Ok(inv_freq_llama3(
                &base,
                s.factor,
                s.low_freq_factor,
                s.high_freq_factor,
                s.original_max_position_embeddings
                    .unwrap_or(self.max_position_embeddings),
            )),
            other => candle_core::bail!("unsupported rope_scaling type {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_from_json() {
        let cfg: LlamaConfig = serde_json::from_str(
            r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "max_position_embeddings": 32, "vocab_size": 100,
                "head_dim": null, "architectures": ["LlamaForCausalLM"]}"#,
        )
        .unwrap();
        assert_eq!(cfg.num_kv_heads(), 4);
        assert_eq!(cfg.head_dim(), 16);
        assert_eq!(cfg.rope_theta, 10000.0);
        assert!(!cfg.tie_word_embeddings);
        assert_eq!(cfg.hidden_act, "silu");
    }
}
