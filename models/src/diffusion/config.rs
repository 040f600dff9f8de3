//! The diffusers JSON configs of each component, read with serde and mapped
//! onto candle-transformers' config structs. Whatever those modules cannot
//! run is refused with an error naming the file and the field.

use candle_core::{bail, Result};
use candle_transformers::models::stable_diffusion::{
    unet_2d::{BlockConfig, UNet2DConditionModelConfig},
    vae::AutoEncoderKLConfig,
};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| candle_core::Error::Msg(format!("reading {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| candle_core::Error::Msg(format!("parsing {}: {e}", path.display())))
}

/// Errors unless `value` is absent or JSON null.
pub(crate) fn refuse_set(file: &str, field: &str, value: &Option<Value>) -> Result<()> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(v) => bail!("{file}: {field} = {v} is not supported"),
    }
}

/// Errors unless `value` is absent or equals `expected`.
pub(crate) fn require_str(
    file: &str,
    field: &str,
    value: &Option<String>,
    expected: &[&str],
) -> Result<()> {
    match value {
        Some(v) if !expected.contains(&v.as_str()) => {
            bail!("{file}: {field} = {v:?} is not supported (expected one of {expected:?})")
        }
        _ => Ok(()),
    }
}

/// `model_index.json`: only the pipeline class is checked.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelIndex {
    #[serde(rename = "_class_name")]
    pub class_name: Option<String>,
    pub text_encoder_2: Option<Value>,
}

impl ModelIndex {
    pub(crate) fn check(&self) -> Result<()> {
        require_str(
            "model_index.json",
            "_class_name",
            &self.class_name,
            &["StableDiffusionPipeline"],
        )?;
        refuse_set("model_index.json", "text_encoder_2", &self.text_encoder_2)
    }
}

fn default_true() -> bool {
    true
}
fn default_groups() -> usize {
    32
}
fn default_eps() -> f64 {
    1e-5
}
fn default_one() -> usize {
    1
}
fn default_latent_channels() -> usize {
    4
}
fn default_scaling() -> f64 {
    0.18215
}

/// `unet/config.json` (diffusers' UNet2DConditionModel).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct UNetJson {
    pub sample_size: Option<usize>,
    #[serde(default = "default_latent_channels")]
    pub in_channels: usize,
    #[serde(default = "default_latent_channels")]
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    pub mid_block_type: Option<Value>,
    pub layers_per_block: Value,
    pub attention_head_dim: Option<Value>,
    pub num_attention_heads: Option<Value>,
    pub transformer_layers_per_block: Option<Value>,
    pub cross_attention_dim: Value,
    #[serde(default = "default_groups")]
    pub norm_num_groups: usize,
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub use_linear_projection: bool,
    #[serde(default = "default_true")]
    pub flip_sin_to_cos: bool,
    #[serde(default)]
    pub freq_shift: f64,
    #[serde(default)]
    pub center_input_sample: bool,
    #[serde(default = "default_one")]
    pub downsample_padding: usize,
    #[serde(default = "default_mid_scale")]
    pub mid_block_scale_factor: f64,
    pub act_fn: Option<String>,
    pub resnet_time_scale_shift: Option<String>,
    pub time_embedding_type: Option<String>,
    pub attention_type: Option<String>,
    pub addition_embed_type: Option<Value>,
    pub class_embed_type: Option<Value>,
    pub num_class_embeds: Option<Value>,
    pub encoder_hid_dim: Option<Value>,
    pub time_cond_proj_dim: Option<Value>,
    pub projection_class_embeddings_input_dim: Option<Value>,
    pub conv_in_kernel: Option<usize>,
    pub conv_out_kernel: Option<usize>,
    pub only_cross_attention: Option<Value>,
    pub dual_cross_attention: Option<bool>,
}

fn default_mid_scale() -> f64 {
    1.0
}

/// An int, or a list of ints of length `n`, as one value per block.
fn per_block(file: &str, field: &str, v: &Value, n: usize) -> Result<Vec<usize>> {
    match v {
        Value::Number(x) if x.as_u64().is_some() => Ok(vec![x.as_u64().unwrap() as usize; n]),
        Value::Array(xs) if xs.len() == n && xs.iter().all(|x| x.as_u64().is_some()) => {
            Ok(xs.iter().map(|x| x.as_u64().unwrap() as usize).collect())
        }
        _ => bail!("{file}: {field} = {v} is not supported (an integer or {n} integers)"),
    }
}

impl UNetJson {
    pub(crate) fn to_candle(&self) -> Result<UNet2DConditionModelConfig> {
        const F: &str = "unet/config.json";
        refuse_set(F, "addition_embed_type", &self.addition_embed_type)?;
        refuse_set(F, "class_embed_type", &self.class_embed_type)?;
        refuse_set(F, "num_class_embeds", &self.num_class_embeds)?;
        refuse_set(F, "encoder_hid_dim", &self.encoder_hid_dim)?;
        refuse_set(F, "time_cond_proj_dim", &self.time_cond_proj_dim)?;
        refuse_set(
            F,
            "projection_class_embeddings_input_dim",
            &self.projection_class_embeddings_input_dim,
        )?;
        require_str(F, "act_fn", &self.act_fn, &["silu"])?;
        require_str(
            F,
            "resnet_time_scale_shift",
            &self.resnet_time_scale_shift,
            &["default"],
        )?;
        require_str(
            F,
            "time_embedding_type",
            &self.time_embedding_type,
            &["positional"],
        )?;
        require_str(F, "attention_type", &self.attention_type, &["default"])?;
        for (field, k) in [
            ("conv_in_kernel", self.conv_in_kernel),
            ("conv_out_kernel", self.conv_out_kernel),
        ] {
            if matches!(k, Some(k) if k != 3) {
                bail!("{F}: {field} = {} is not supported (only 3)", k.unwrap())
            }
        }
        if matches!(&self.only_cross_attention, Some(v) if v != &Value::Bool(false)) {
            bail!("{F}: only_cross_attention is not supported")
        }
        if self.dual_cross_attention == Some(true) {
            bail!("{F}: dual_cross_attention is not supported")
        }
        match &self.mid_block_type {
            None => {}
            Some(Value::String(s)) if s == "UNetMidBlock2DCrossAttn" => {}
            Some(v) => {
                bail!("{F}: mid_block_type = {v} is not supported (only UNetMidBlock2DCrossAttn)")
            }
        }
        let n = self.block_out_channels.len();
        if n == 0 {
            bail!("{F}: block_out_channels is empty")
        }
        if self.down_block_types.len() != n || self.up_block_types.len() != n {
            bail!("{F}: down_block_types and up_block_types must have one entry per block_out_channels")
        }
        let layers_per_block = match self.layers_per_block.as_u64() {
            Some(l) => l as usize,
            None => bail!(
                "{F}: layers_per_block = {} is not supported (a single integer)",
                self.layers_per_block
            ),
        };
        let cross_attention_dim = match self.cross_attention_dim.as_u64() {
            Some(d) => d as usize,
            None => bail!(
                "{F}: cross_attention_dim = {} is not supported (a single integer)",
                self.cross_attention_dim
            ),
        };
        // diffusers' attention_head_dim of SD 1.x/2.x is in fact the number
        // of heads (num_attention_heads, when set, takes precedence), which
        // is what candle's BlockConfig::attention_head_dim holds too.
        let heads_value = match (&self.num_attention_heads, &self.attention_head_dim) {
            (Some(v), _) if !v.is_null() => ("num_attention_heads", v.clone()),
            (_, Some(v)) if !v.is_null() => ("attention_head_dim", v.clone()),
            _ => ("attention_head_dim", Value::from(8)),
        };
        let heads = per_block(F, heads_value.0, &heads_value.1, n)?;
        let transformer_layers = match &self.transformer_layers_per_block {
            None | Some(Value::Null) => vec![1; n],
            Some(v) => per_block(F, "transformer_layers_per_block", v, n)?,
        };
        let mut blocks = Vec::with_capacity(n);
        for i in 0..n {
            let cross = match self.down_block_types[i].as_str() {
                "CrossAttnDownBlock2D" => true,
                "DownBlock2D" => false,
                other => bail!("{F}: down_block_types[{i}] = {other:?} is not supported (CrossAttnDownBlock2D or DownBlock2D)"),
            };
            let up_expected = if cross {
                "CrossAttnUpBlock2D"
            } else {
                "UpBlock2D"
            };
            let up = &self.up_block_types[n - 1 - i];
            if up != up_expected {
                bail!(
                    "{F}: up_block_types[{}] = {up:?} is not supported (it must mirror down_block_types: {up_expected})",
                    n - 1 - i
                )
            }
            let out_channels = self.block_out_channels[i];
            if heads[i] == 0 || !out_channels.is_multiple_of(heads[i]) {
                bail!(
                    "{F}: {} {} does not divide block_out_channels[{i}] = {out_channels}",
                    heads_value.0,
                    heads[i]
                )
            }
            if !out_channels.is_multiple_of(self.norm_num_groups) {
                bail!("{F}: norm_num_groups {} does not divide block_out_channels[{i}] = {out_channels}", self.norm_num_groups)
            }
            blocks.push(BlockConfig {
                out_channels,
                use_cross_attn: cross.then_some(transformer_layers[i]),
                attention_head_dim: heads[i],
            });
        }
        Ok(UNet2DConditionModelConfig {
            center_input_sample: self.center_input_sample,
            flip_sin_to_cos: self.flip_sin_to_cos,
            freq_shift: self.freq_shift,
            blocks,
            layers_per_block,
            downsample_padding: self.downsample_padding,
            mid_block_scale_factor: self.mid_block_scale_factor,
            norm_num_groups: self.norm_num_groups,
            norm_eps: self.norm_eps,
            cross_attention_dim,
            // candle-transformers' sliced attention stacks its slices
            // into a 4-d tensor and then fails; the pipeline bounds
            // attention memory by running one image at a time instead.
            sliced_attention_size: None,
            use_linear_projection: self.use_linear_projection,
        })
    }
}

/// `vae/config.json` (diffusers' AutoencoderKL).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct VaeJson {
    pub block_out_channels: Vec<usize>,
    #[serde(default = "default_one")]
    pub layers_per_block: usize,
    #[serde(default = "default_latent_channels")]
    pub latent_channels: usize,
    #[serde(default = "default_groups")]
    pub norm_num_groups: usize,
    #[serde(default = "default_rgb")]
    pub in_channels: usize,
    #[serde(default = "default_rgb")]
    pub out_channels: usize,
    pub scaling_factor: Option<f64>,
    pub shift_factor: Option<Value>,
    pub latents_mean: Option<Value>,
    pub latents_std: Option<Value>,
    #[serde(default = "default_true")]
    pub use_quant_conv: bool,
    #[serde(default = "default_true")]
    pub use_post_quant_conv: bool,
    #[serde(default = "default_true")]
    pub mid_block_add_attention: bool,
    pub act_fn: Option<String>,
    #[serde(default)]
    pub down_block_types: Vec<String>,
    #[serde(default)]
    pub up_block_types: Vec<String>,
}

fn default_rgb() -> usize {
    3
}

impl VaeJson {
    pub(crate) fn to_candle(&self) -> Result<AutoEncoderKLConfig> {
        const F: &str = "vae/config.json";
        refuse_set(F, "shift_factor", &self.shift_factor)?;
        refuse_set(F, "latents_mean", &self.latents_mean)?;
        refuse_set(F, "latents_std", &self.latents_std)?;
        require_str(F, "act_fn", &self.act_fn, &["silu"])?;
        if !self.mid_block_add_attention {
            bail!("{F}: mid_block_add_attention = false is not supported")
        }
        if self.block_out_channels.is_empty() {
            bail!("{F}: block_out_channels is empty")
        }
        for (i, t) in self.down_block_types.iter().enumerate() {
            if t != "DownEncoderBlock2D" {
                bail!("{F}: down_block_types[{i}] = {t:?} is not supported (DownEncoderBlock2D)")
            }
        }
        for (i, t) in self.up_block_types.iter().enumerate() {
            if t != "UpDecoderBlock2D" {
                bail!("{F}: up_block_types[{i}] = {t:?} is not supported (UpDecoderBlock2D)")
            }
        }
        if self.out_channels != 3 {
            bail!(
                "{F}: out_channels = {} is not supported (3, RGB)",
                self.out_channels
            )
        }
        Ok(AutoEncoderKLConfig {
            block_out_channels: self.block_out_channels.clone(),
            layers_per_block: self.layers_per_block,
            latent_channels: self.latent_channels,
            norm_num_groups: self.norm_num_groups,
            use_quant_conv: self.use_quant_conv,
            use_post_quant_conv: self.use_post_quant_conv,
        })
    }

    /// Pixels per latent along each side: 2^(number of blocks - 1).
    pub(crate) fn scale_factor(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }

    pub(crate) fn scaling_factor(&self) -> f64 {
        self.scaling_factor.unwrap_or_else(default_scaling)
    }
}
