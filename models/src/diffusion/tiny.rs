//! [`write_tiny_pipeline`]: a tiny random-weight Stable Diffusion pipeline in
//! the diffusers layout, for tests (here and in the server).
//!
//! The architecture is SD 1.x's (quick_gelu CLIP text encoder, UNet with
//! cross-attention, KL VAE) with small channel counts: CLIP hidden 32, 2
//! layers, 4 heads; UNet blocks [32, 64]; VAE blocks [32, 32, 64, 64]
//! (scale factor 8); sample size 8, so 64x64 images from 8x8 latents. The
//! modules are built with candle-transformers' constructors over a
//! `VarMap`, so the saved tensor names are exactly the ones the loader
//! reads; every variable is then overwritten from the seed.

use super::config::{UNetJson, VaeJson};
use super::noise::Gaussian;
use super::text_encoder::ClipTextJson;
use super::tokenizer::{BOS, EOS};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::clip::text_model::ClipTextTransformer;
use candle_transformers::models::stable_diffusion::{
    unet_2d::UNet2DConditionModel, vae::AutoEncoderKL,
};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Words the tiny vocabulary merges whole (each also spelled by its letters).
const WORDS: &[&str] = &[
    "a",
    "an",
    "the",
    "of",
    "in",
    "on",
    "with",
    "and",
    "photo",
    "painting",
    "cat",
    "dog",
    "horse",
    "tree",
    "house",
    "red",
    "blue",
    "green",
    "astronaut",
    "riding",
    "city",
    "night",
    "sky",
    "sun",
    "portrait",
    "style",
    "oil",
    "high",
    "quality",
    "blurry",
    "low",
];

fn io_err(path: &Path, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("writing {}: {e}", path.display()))
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| io_err(path, e))?;
    std::fs::write(path, text).map_err(|e| io_err(path, e))
}

/// CLIP-style vocab.json (insertion ordered) and merges.txt: the printable
/// ASCII characters with and without `</w>`, the merges spelling [`WORDS`]
/// left to right, then the two special tokens.
fn tiny_vocab() -> (Map<String, Value>, String) {
    let mut tokens: Vec<String> = Vec::new();
    let chars: Vec<String> = (33u8..=126).map(|b| (b as char).to_string()).collect();
    tokens.extend(chars.iter().cloned());
    tokens.extend(chars.iter().map(|c| format!("{c}</w>")));
    let mut merges = vec!["#version: 0.2".to_string()];
    for word in WORDS {
        let letters: Vec<String> = word.chars().map(|c| c.to_string()).collect();
        let mut left = letters[0].clone();
        for (i, next) in letters.iter().enumerate().skip(1) {
            let right = if i + 1 == letters.len() {
                format!("{next}</w>")
            } else {
                next.clone()
            };
            let merged = format!("{left}{right}");
            if !tokens.contains(&merged) {
                merges.push(format!("{left} {right}"));
                tokens.push(merged.clone());
            }
            left = merged;
        }
    }
    tokens.push(BOS.into());
    tokens.push(EOS.into());
    let vocab = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| (t, Value::from(id)))
        .collect();
    (vocab, merges.join("\n") + "\n")
}

/// Overwrites every variable with seeded values: matrices and kernels
/// uniform with std sqrt(1/fan_in), norm scales near 1, biases near 0.
fn randomize(varmap: &VarMap, seed: u64) -> Result<()> {
    let data = varmap.data().lock().expect("varmap lock");
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut rng = Gaussian::new(seed);
    for name in names {
        let var = &data[name];
        let dims = var.dims().to_vec();
        let count: usize = dims.iter().product();
        let mut uniform = || (2.0 * rng.uniform() - 1.0) as f32;
        let values: Vec<f32> = if dims.len() >= 2 {
            let fan_in: usize = dims[1..].iter().product();
            let bound = (3.0 / fan_in.max(1) as f32).sqrt();
            (0..count).map(|_| bound * uniform()).collect()
        } else if name.ends_with("weight") {
            (0..count).map(|_| 1.0 + 0.1 * uniform()).collect()
        } else {
            (0..count).map(|_| 0.05 * uniform()).collect()
        };
        var.set(&Tensor::from_vec(values, dims, &Device::Cpu)?)?;
    }
    Ok(())
}

/// Builds a component with `build` over a fresh VarMap, randomizes it from
/// `seed` and saves it to `file`.
fn write_component(
    file: &Path,
    seed: u64,
    build: impl FnOnce(VarBuilder) -> Result<()>,
) -> Result<()> {
    let varmap = VarMap::new();
    build(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    randomize(&varmap, seed)?;
    varmap.save(file)
}

/// Writes a tiny random-weight pipeline (SD 1.x architecture, 64x64 images)
/// in the diffusers layout under `dir`, from a fixed seed.
pub fn write_tiny_pipeline(dir: &Path, seed: u64) -> Result<()> {
    for sub in ["tokenizer", "text_encoder", "unet", "vae", "scheduler"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(|e| io_err(&path, e))?;
    }
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "StableDiffusionPipeline",
            "_diffusers_version": "0.30.0",
            "feature_extractor": [null, null],
            "requires_safety_checker": false,
            "safety_checker": [null, null],
            "scheduler": ["diffusers", "EulerAncestralDiscreteScheduler"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        }),
    )?;

    let (vocab, merges) = tiny_vocab();
    let vocab_size = vocab.len();
    let eos_id = vocab[EOS].clone();
    let bos_id = vocab[BOS].clone();
    write_json(&dir.join("tokenizer/vocab.json"), &Value::Object(vocab))?;
    let path = dir.join("tokenizer/merges.txt");
    std::fs::write(&path, merges).map_err(|e| io_err(&path, e))?;
    write_json(
        &dir.join("tokenizer/tokenizer_config.json"),
        &json!({
            "tokenizer_class": "CLIPTokenizer",
            "model_max_length": 77,
            "do_lower_case": true,
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "unk_token": EOS,
        }),
    )?;

    let clip = json!({
        "architectures": ["CLIPTextModel"],
        "model_type": "clip_text_model",
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 77,
        "hidden_act": "quick_gelu",
        "projection_dim": 32,
        "layer_norm_eps": 1e-5,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "torch_dtype": "float32",
    });
    write_json(&dir.join("text_encoder/config.json"), &clip)?;
    let clip: ClipTextJson = serde_json::from_value(clip).map_err(|e| io_err(dir, e))?;
    write_component(&dir.join("text_encoder/model.safetensors"), seed, |vb| {
        ClipTextTransformer::new(vb.pp("text_model"), &clip.text_model_config()).map(drop)
    })?;

    let unet = json!({
        "_class_name": "UNet2DConditionModel",
        "_diffusers_version": "0.30.0",
        "act_fn": "silu",
        "attention_head_dim": [2, 4],
        "block_out_channels": [32, 64],
        "center_input_sample": false,
        "cross_attention_dim": 32,
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "downsample_padding": 1,
        "flip_sin_to_cos": true,
        "freq_shift": 0,
        "in_channels": 4,
        "layers_per_block": 1,
        "mid_block_scale_factor": 1,
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "norm_eps": 1e-5,
        "norm_num_groups": 32,
        "out_channels": 4,
        "sample_size": 8,
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
        "use_linear_projection": false,
    });
    write_json(&dir.join("unet/config.json"), &unet)?;
    let unet: UNetJson = serde_json::from_value(unet).map_err(|e| io_err(dir, e))?;
    let unet_config = unet.to_candle()?;
    write_component(
        &dir.join("unet/diffusion_pytorch_model.safetensors"),
        seed.wrapping_add(1),
        |vb| UNet2DConditionModel::new(vb, 4, 4, false, unet_config).map(drop),
    )?;

    let vae = json!({
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.30.0",
        "act_fn": "silu",
        "block_out_channels": [32, 32, 64, 64],
        "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
        "in_channels": 3,
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 32,
        "out_channels": 3,
        "sample_size": 64,
        "scaling_factor": 0.18215,
        "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
    });
    write_json(&dir.join("vae/config.json"), &vae)?;
    let vae: VaeJson = serde_json::from_value(vae).map_err(|e| io_err(dir, e))?;
    let vae_config = vae.to_candle()?;
    let mid_channels = *vae_config.block_out_channels.last().unwrap_or(&32);
    write_component(
        &dir.join("vae/diffusion_pytorch_model.safetensors"),
        seed.wrapping_add(2),
        |vb| {
            // The mid-block attention reads current diffusers names (to_q,
            // to_k, ...) when to_q exists, legacy ones (query, key, ...)
            // otherwise: create to_q first so the current names are written.
            for part in ["encoder", "decoder"] {
                vb.pp(part)
                    .pp("mid_block.attentions.0.to_q")
                    .get((mid_channels, mid_channels), "weight")?;
            }
            AutoEncoderKL::new(vb, 3, 3, vae_config).map(drop)
        },
    )?;

    write_json(
        &dir.join("scheduler/scheduler_config.json"),
        &json!({
            "_class_name": "EulerAncestralDiscreteScheduler",
            "_diffusers_version": "0.30.0",
            "beta_end": 0.012,
            "beta_schedule": "scaled_linear",
            "beta_start": 0.00085,
            "num_train_timesteps": 1000,
            "prediction_type": "epsilon",
            "steps_offset": 1,
            "timestep_spacing": "leading",
            "trained_betas": null,
        }),
    )
}
