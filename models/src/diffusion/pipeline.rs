//! [`DiffusionPipeline`]: loading a diffusers folder and generating images.

use super::config::{read_json, ModelIndex, UNetJson, VaeJson};
use super::noise::Gaussian;
use super::scheduler::{Sampler, SchedulerJson, SchedulerKind};
use super::text_encoder::{ClipTextJson, TextEncoder};
use super::tokenizer::ClipTokenizer;
use super::{ImageParams, RgbImage};
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{
    unet_2d::UNet2DConditionModel, vae::AutoEncoderKL,
};
use std::path::{Path, PathBuf};

/// Largest width or height [`DiffusionPipeline::supports_size`] accepts.
const MAX_SIDE: usize = 2048;

/// A Stable Diffusion (1.x / 2.x architecture) text-to-image pipeline.
pub struct DiffusionPipeline {
    tokenizer: ClipTokenizer,
    text_encoder: TextEncoder,
    unet: UNet2DConditionModel,
    vae: AutoEncoderKL,
    scheduler: SchedulerKind,
    default_steps: usize,
    /// Latent side the UNet was trained at.
    sample_size: usize,
    /// Pixels per latent along a side.
    vae_scale: usize,
    /// Sides must be multiples of this.
    size_multiple: usize,
    scaling_factor: f64,
    latent_channels: usize,
    /// Heads of the attention of each UNet block (0 when it has none),
    /// from the highest resolution down; each block halves both sides.
    block_heads: Vec<usize>,
    device: Device,
    dtype: DType,
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DiffusionPipeline>();
};

/// `<dir>/<component>/<stem>.safetensors`, or its `.fp16` variant.
fn weights_file(dir: &Path, component: &str, stem: &str) -> Result<PathBuf> {
    for name in [
        format!("{stem}.safetensors"),
        format!("{stem}.fp16.safetensors"),
    ] {
        let path = dir.join(component).join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!("{}: no {component}/{stem}.safetensors", dir.display())
}

fn var_builder<'a>(file: &Path, dtype: DType, device: &Device) -> Result<VarBuilder<'a>> {
    // SAFETY: the weights file is mapped read-only and is not expected to be
    // modified while the model is loaded (the same contract as candle's
    // loaders elsewhere in Hearth).
    unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) }
}

impl DiffusionPipeline {
    /// Loads a diffusers folder: model_index.json, tokenizer/, text_encoder/,
    /// unet/, vae/, scheduler/.
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let index: ModelIndex = read_json(&dir.join("model_index.json"))?;
        index.check()?;
        let clip: ClipTextJson = read_json(&dir.join("text_encoder/config.json"))?;
        let unet_json: UNetJson = read_json(&dir.join("unet/config.json"))?;
        let unet_config = unet_json.to_candle()?;
        let vae_json: VaeJson = read_json(&dir.join("vae/config.json"))?;
        let vae_config = vae_json.to_candle()?;
        let scheduler_json: SchedulerJson =
            read_json(&dir.join("scheduler/scheduler_config.json"))?;
        let scheduler = scheduler_json.to_candle()?;
        if unet_config.cross_attention_dim != clip.hidden_size {
            bail!(
                "unet/config.json: cross_attention_dim = {} does not match the text encoder's hidden_size {}",
                unet_config.cross_attention_dim,
                clip.hidden_size
            )
        }
        if unet_json.in_channels != vae_json.latent_channels
            || unet_json.out_channels != vae_json.latent_channels
        {
            bail!(
                "unet/config.json: in_channels/out_channels {}/{} do not match the VAE's latent_channels {}",
                unet_json.in_channels,
                unet_json.out_channels,
                vae_json.latent_channels
            )
        }
        let tokenizer = ClipTokenizer::load(&dir.join("tokenizer"), clip.max_position_embeddings)?;

        let file = weights_file(dir, "text_encoder", "model")?;
        let text_encoder = TextEncoder::new(var_builder(&file, dtype, device)?, &clip)?;
        let file = weights_file(dir, "unet", "diffusion_pytorch_model")?;
        let unet = UNet2DConditionModel::new(
            var_builder(&file, dtype, device)?,
            unet_json.in_channels,
            unet_json.out_channels,
            false,
            unet_config.clone(),
        )?;
        let file = weights_file(dir, "vae", "diffusion_pytorch_model")?;
        let vae = AutoEncoderKL::new(
            var_builder(&file, dtype, device)?,
            vae_json.in_channels,
            vae_json.out_channels,
            vae_config,
        )?;

        let block_heads = unet_config
            .blocks
            .iter()
            .map(|b| b.use_cross_attn.map_or(0, |_| b.attention_head_dim))
            .collect();
        let vae_scale = vae_json.scale_factor();
        let size_multiple = vae_scale << (unet_config.blocks.len() - 1);
        // Turbo-like models (sd-turbo) are distilled for one step with
        // "trailing" timesteps; everything else gets the usual 30.
        let default_steps = if scheduler_json.spacing_name() == "trailing" {
            1
        } else {
            30
        };
        Ok(Self {
            tokenizer,
            text_encoder,
            unet,
            vae,
            scheduler,
            default_steps,
            sample_size: unet_json.sample_size.unwrap_or(64),
            vae_scale,
            size_multiple,
            scaling_factor: vae_json.scaling_factor(),
            latent_channels: vae_json.latent_channels,
            block_heads,
            device: device.clone(),
            dtype,
        })
    }

    /// (width, height) the model was trained at (unet sample_size * vae
    /// scale factor).
    pub fn default_size(&self) -> (usize, usize) {
        let side = self.sample_size * self.vae_scale;
        (side, side)
    }

    /// Whether width x height can be generated: both multiples of
    /// [`Self::size_multiple`] (and at least that), at most 2048.
    pub fn supports_size(&self, width: usize, height: usize) -> bool {
        let m = self.size_multiple;
        [width, height]
            .iter()
            .all(|&s| s >= m && s % m == 0 && s <= MAX_SIDE)
    }

    /// Bytes the largest attention of one UNet or VAE pass holds at once
    /// for a `width` x `height` image: its scores and their softmax, heads
    /// x tokens^2 each, where a block's tokens are the latent's pixels
    /// (a quarter fewer per block down). Memory grows with the square of
    /// the image's area: this is what bounds the sizes a server accepts.
    pub fn attention_bytes(&self, width: usize, height: usize) -> u64 {
        let tokens = ((width / self.vae_scale) * (height / self.vae_scale)) as u64;
        let unet = self
            .block_heads
            .iter()
            .enumerate()
            .map(|(i, &heads)| {
                let t = tokens >> (2 * i);
                heads as u64 * t * t
            })
            .max()
            .unwrap_or(0);
        // The VAE's mid-block attention: one head over the latent's pixels.
        let vae = tokens * tokens;
        2 * self.dtype.size_in_bytes() as u64 * unet.max(vae)
    }

    /// Sides must be multiples of this: the VAE's scale factor times the
    /// UNet's downsampling (8 * 2^(down blocks - 1) for SD).
    pub fn size_multiple(&self) -> usize {
        self.size_multiple
    }

    /// A human-readable statement of the accepted sizes, for error messages.
    pub fn size_rule(&self) -> String {
        format!(
            "width and height must be multiples of {m} from {m} to {MAX_SIDE}",
            m = self.size_multiple
        )
    }

    /// Default denoising steps: 1 when the scheduler's timestep_spacing is
    /// "trailing" (turbo-like models), else 30.
    pub fn default_steps(&self) -> usize {
        self.default_steps
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The prompt's token ids, always the text encoder's full length (77 for
    /// SD): `<|startoftext|>`, the prompt's tokens, `<|endoftext|>`, padding.
    pub fn tokenize(&self, prompt: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(prompt)
    }

    /// The text encoder's last hidden states for token ids `[batch, len]`
    /// (u32): `[batch, len, hidden]`.
    pub fn encode_tokens(&self, ids: &Tensor) -> Result<Tensor> {
        self.text_encoder.forward(ids)
    }

    /// The UNet's noise prediction for `latents` at `timestep`, conditioned
    /// on `text` (`[batch, len, hidden]`).
    pub fn predict_noise(&self, latents: &Tensor, timestep: f64, text: &Tensor) -> Result<Tensor> {
        self.unet.forward(latents, timestep, text)
    }

    /// The VAE decoder on (unscaled) latents: `[batch, 3, h, w]` in about
    /// -1..1.
    pub fn vae_decode(&self, latents: &Tensor) -> Result<Tensor> {
        self.vae.decode(latents)
    }

    /// `[1, len, hidden]` text embeddings of a prompt.
    fn embed(&self, prompt: &str) -> Result<Tensor> {
        let ids = self.tokenize(prompt)?;
        let len = ids.len();
        let ids = Tensor::from_vec(ids, (1, len), &self.device)?;
        self.encode_tokens(&ids)
    }

    /// Standard-normal latents-shaped noise, image `i` from `rngs[i]`.
    fn noise(&self, rngs: &mut [Gaussian], (c, h, w): (usize, usize, usize)) -> Result<Tensor> {
        let data: Vec<f32> = rngs.iter_mut().flat_map(|r| r.normals(c * h * w)).collect();
        Tensor::from_vec(data, (rngs.len(), c, h, w), &Device::Cpu)?
            .to_device(&self.device)?
            .to_dtype(self.dtype)
    }

    /// Generates `params.n` images, each step running the UNet on one image
    /// at a time (twice when guidance_scale > 1, classifier-free guidance:
    /// unconditioned, then conditioned): an attention's scores grow with
    /// the square of the latent's size, so a batch would take as many
    /// times the memory ([`Self::attention_bytes`] is one pass's), and each
    /// image comes out exactly as it would alone (image `i` of seed `s` is
    /// image 0 of seed `s + i`).
    /// `on_step(step, total)` is called after each denoising step;
    /// returning false stops the generation with an error "cancelled".
    pub fn generate(
        &self,
        params: &ImageParams,
        on_step: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<Vec<RgbImage>> {
        let n = params.n;
        if n == 0 {
            bail!("n must be at least 1")
        }
        if !self.supports_size(params.width, params.height) {
            bail!(
                "image size {}x{} is not supported: {}",
                params.width,
                params.height,
                self.size_rule()
            )
        }
        if !params.guidance_scale.is_finite() {
            bail!("guidance_scale must be a finite number")
        }
        let mut sampler = Sampler::new(&self.scheduler, params.steps)?;
        let guided = params.guidance_scale > 1.0;

        let cond = self.embed(&params.prompt)?;
        let text = if guided {
            let negative = params.negative_prompt.as_deref().unwrap_or("");
            let uncond = self.embed(negative)?;
            Tensor::cat(&[uncond, cond], 0)?
        } else {
            cond
        };

        let shape = (
            self.latent_channels,
            params.height / self.vae_scale,
            params.width / self.vae_scale,
        );
        let mut rngs: Vec<Gaussian> = (0..n)
            .map(|i| Gaussian::new(params.seed.wrapping_add(i as u64)))
            .collect();
        let mut latents = (self.noise(&mut rngs, shape)? * sampler.init_noise_sigma())?;

        let timesteps = sampler.timesteps().to_vec();
        let total = timesteps.len();
        for (index, &timestep) in timesteps.iter().enumerate() {
            let input = sampler.scale_model_input(latents.clone(), timestep)?;
            let outputs = (0..n)
                .map(|i| {
                    let one = input.narrow(0, i, 1)?;
                    let t = timestep as f64;
                    if guided {
                        // The two passes one after the other, not as a
                        // batch of two: half the attention memory.
                        let uncond = self.unet.forward(&one, t, &text.narrow(0, 0, 1)?)?;
                        let cond = self.unet.forward(&one, t, &text.narrow(0, 1, 1)?)?;
                        &uncond + ((cond - &uncond)? * params.guidance_scale)?
                    } else {
                        self.unet.forward(&one, t, &text)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let output = Tensor::cat(&outputs, 0)?;
            latents = sampler.step(index, &output, &latents, &mut || {
                self.noise(&mut rngs, shape)
            })?;
            if !on_step(index + 1, total) {
                bail!("cancelled")
            }
        }

        let latents = (latents / self.scaling_factor)?;
        (0..n)
            .map(|i| self.to_image(&self.vae.decode(&latents.narrow(0, i, 1)?)?))
            .collect()
    }

    /// `[1, 3, h, w]` in -1..1 to RGB8.
    fn to_image(&self, decoded: &Tensor) -> Result<RgbImage> {
        let (_, _, height, width) = decoded.dims4()?;
        let values = ((decoded.to_dtype(DType::F32)? / 2.0)? + 0.5)?
            .clamp(0f32, 1f32)?
            .squeeze(0)?
            .permute((1, 2, 0))?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let pixels = values.iter().map(|&v| (v * 255.0).round() as u8).collect();
        Ok(RgbImage {
            width,
            height,
            pixels,
        })
    }
}
