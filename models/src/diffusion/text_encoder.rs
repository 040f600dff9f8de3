//! The CLIP text encoder: candle-transformers' `clip::text_model` for the
//! quick_gelu CLIPs of SD 1.x (any size, its config is open), and
//! `stable_diffusion::clip` for the gelu CLIPs it has presets of (SD 2.x's
//! OpenCLIP text tower; that module's config can only be built from its
//! presets).

use candle_core::{bail, Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::clip::text_model::{
    Activation, ClipTextConfig, ClipTextTransformer as OpenClipText,
};
use candle_transformers::models::stable_diffusion::clip as sd_clip;
use serde::Deserialize;

/// `text_encoder/config.json` (transformers' CLIPTextConfig).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ClipTextJson {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    #[serde(default = "default_projection_dim")]
    pub projection_dim: usize,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f64,
}

fn default_max_positions() -> usize {
    77
}
fn default_hidden_act() -> String {
    "quick_gelu".into()
}
fn default_projection_dim() -> usize {
    512
}
fn default_layer_norm_eps() -> f64 {
    1e-5
}

impl ClipTextJson {
    /// candle-transformers' config for a quick_gelu encoder of any size.
    pub(crate) fn text_model_config(&self) -> ClipTextConfig {
        ClipTextConfig {
            vocab_size: self.vocab_size,
            embed_dim: self.hidden_size,
            activation: Activation::QuickGelu,
            intermediate_size: self.intermediate_size,
            max_position_embeddings: self.max_position_embeddings,
            pad_with: None,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            projection_dim: self.projection_dim,
        }
    }

    fn check(&self) -> Result<()> {
        const F: &str = "text_encoder/config.json";
        if (self.layer_norm_eps - 1e-5).abs() > 1e-12 {
            bail!(
                "{F}: layer_norm_eps = {} is not supported (1e-5)",
                self.layer_norm_eps
            )
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            bail!("{F}: num_attention_heads does not divide hidden_size")
        }
        Ok(())
    }
}

/// A CLIP text transformer returning the last hidden states (after the
/// final layer norm), `[batch, seq, hidden]`.
#[derive(Debug)]
pub(crate) enum TextEncoder {
    QuickGelu(OpenClipText),
    GeluPreset(sd_clip::ClipTextTransformer),
}

impl TextEncoder {
    /// `vb` at the root of `text_encoder/model.safetensors`.
    pub(crate) fn new(vb: VarBuilder, c: &ClipTextJson) -> Result<Self> {
        const F: &str = "text_encoder/config.json";
        c.check()?;
        match c.hidden_act.as_str() {
            "quick_gelu" => Ok(Self::QuickGelu(OpenClipText::new(
                vb.pp("text_model"),
                &c.text_model_config(),
            )?)),
            "gelu" => {
                let sizes = (
                    c.vocab_size,
                    c.hidden_size,
                    c.intermediate_size,
                    c.num_hidden_layers,
                    c.num_attention_heads,
                    c.max_position_embeddings,
                );
                let preset = match sizes {
                    (49408, 1024, 4096, 23, 16, 77) => sd_clip::Config::v2_1(),
                    (49408, 1280, 5120, 32, 20, 77) => sd_clip::Config::sdxl2(),
                    _ => bail!(
                        "{F}: a hidden_act = \"gelu\" encoder of these sizes is not supported \
                         (only SD 2.x's: hidden_size 1024, 23 layers, 16 heads)"
                    ),
                };
                Ok(Self::GeluPreset(sd_clip::ClipTextTransformer::new(
                    vb, &preset,
                )?))
            }
            other => bail!("{F}: hidden_act = {other:?} is not supported (quick_gelu or gelu)"),
        }
    }

    pub(crate) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Self::QuickGelu(m) => m.forward_with_mask(ids, usize::MAX),
            Self::GeluPreset(m) => m.forward(ids),
        }
    }
}
