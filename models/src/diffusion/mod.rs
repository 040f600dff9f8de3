//! Text-to-image Stable Diffusion (SD 1.x / 2.x architecture) on
//! candle-transformers' `stable_diffusion` modules.
//!
//! [`DiffusionPipeline::load`] reads a local folder in the Hugging Face
//! *diffusers* layout (`model_index.json`, `tokenizer/`, `text_encoder/`,
//! `unet/`, `vae/`, `scheduler/`), maps each component's JSON config onto the
//! candle-transformers config structs (`config.rs`, which refuses what those
//! modules cannot run, naming the field), and [`DiffusionPipeline::generate`]
//! runs classifier-free-guided denoising with the Euler-ancestral scheduler
//! (DDIM when the folder's scheduler asks for it), then decodes with the VAE
//! into [`RgbImage`]s ([`RgbImage::to_png`] encodes them).
//!
//! Noise is drawn on the CPU from a small seeded generator (`noise.rs`), so
//! the same seed and parameters give bit-identical images on the CPU. Image
//! `i` of a request uses seed `seed + i`; it equals that seed's `n = 1`
//! image up to float rounding (all images share one batched UNet pass per
//! step, and a larger batch may round differently in the last bit, which can
//! move a pixel value by one).
//!
//! [`write_tiny_pipeline`] (`tiny.rs`) writes a tiny random-weight pipeline of
//! the same architecture for tests.
//!
//! Files: `config.rs` (diffusers configs), `tokenizer.rs` (CLIP BPE),
//! `text_encoder.rs` (the CLIP text transformer variants), `scheduler.rs`
//! (scheduler config and seeded steps), `pipeline.rs`
//! (loading and generation), `noise.rs`, `png.rs`, `tiny.rs`.

mod config;
mod noise;
mod pipeline;
mod png;
mod scheduler;
mod text_encoder;
mod tiny;
mod tokenizer;

pub use pipeline::DiffusionPipeline;
pub use tiny::write_tiny_pipeline;

/// What to generate.
#[derive(Debug, Clone)]
pub struct ImageParams {
    pub prompt: String,
    /// The unconditional prompt of classifier-free guidance (`""` when
    /// `None`).
    pub negative_prompt: Option<String>,
    /// Number of images (one batched UNet pass per step for all of them).
    pub n: usize,
    pub width: usize,
    pub height: usize,
    /// Denoising steps.
    pub steps: usize,
    /// Classifier-free guidance scale; guidance runs when it is above 1.
    pub guidance_scale: f64,
    /// Image `i` is generated from seed `seed + i`.
    pub seed: u64,
}

/// An 8-bit RGB image.
#[derive(Debug, Clone, PartialEq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    /// Row-major RGB8, `width * height * 3` bytes.
    pub pixels: Vec<u8>,
}
