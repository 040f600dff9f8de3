//! Wire types of `POST /v1/images/generations` (the OpenAI Images API, as
//! the openai SDK's `images.generate` sends it) and their validation.
//!
//! - `prompt` (required, 1 to [`MAX_PROMPT_CHARS`] characters): a missing
//!   or empty prompt is 422 (shape C).
//! - `model`: an image model of the catalogue (the server picks its only
//!   image model when this is left out).
//! - `n`: images to generate, 1 to [`MAX_IMAGES`] (400 shape B beyond).
//! - `size`: `WIDTHxHEIGHT` or `auto` (the model's own size); whether the
//!   model can make it is checked by the server (400 naming `size`).
//! - `response_format`: `url` (default: the PNG is stored as a file of
//!   purpose `image` and the answer carries a signed link that downloads it
//!   without a key) or `b64_json` (the PNG inline, base64).
//! - `quality`, `style`, `user`, `output_format` (only `png`), `background`
//!   (`auto` or `opaque`: the images have no alpha channel), `moderation`:
//!   accepted; they do not change a diffusion model's output.
//! - Extensions: `seed` (fixed seed: the same request gives the same
//!   images), `negative_prompt`, `num_inference_steps` (1 to
//!   [`MAX_STEPS`]), `guidance_scale` (0 to 30; above 1 runs
//!   classifier-free guidance).

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use crate::embeddings::{empty_string, item};
use crate::error::{ApiError, Loc};

/// Most images one request may ask for.
pub const MAX_IMAGES: usize = 8;
/// Longest prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 4000;
/// Most denoising steps one request may ask for.
pub const MAX_STEPS: usize = 150;
/// `purpose` of the files that hold generated images.
pub const PURPOSE_IMAGE: &str = "image";

/// How a generated image comes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ImageResponseFormat {
    #[default]
    Url,
    B64Json,
}

/// Body of `POST /v1/images/generations`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageGenerationRequest {
    pub prompt: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub size: Option<String>,
    #[serde(default)]
    pub response_format: Option<ImageResponseFormat>,
    #[serde(default)]
    pub quality: Option<String>,
    #[serde(default)]
    pub style: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Only `png` is produced.
    #[serde(default)]
    pub output_format: Option<String>,
    /// `auto` or `opaque`; `transparent` is refused (no alpha channel).
    #[serde(default)]
    pub background: Option<String>,
    /// Extension: a fixed seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Extension: what the image should not show.
    #[serde(default)]
    pub negative_prompt: Option<String>,
    /// Extension: denoising steps (default: the model's).
    #[serde(default)]
    pub num_inference_steps: Option<i64>,
    /// Extension: classifier-free guidance scale (default: the model's).
    #[serde(default)]
    pub guidance_scale: Option<f64>,
}

/// The size a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSize {
    /// The model's own size.
    Auto,
    Exact {
        width: usize,
        height: usize,
    },
}

/// A validated image request (the model and size still to be checked
/// against what the server serves).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidImageRequest {
    pub prompt: String,
    pub model: Option<String>,
    pub n: usize,
    pub size: ImageSize,
    pub response_format: ImageResponseFormat,
    pub seed: Option<u64>,
    pub negative_prompt: Option<String>,
    pub steps: Option<usize>,
    pub guidance_scale: Option<f64>,
}

impl ImageGenerationRequest {
    pub fn validate(self) -> Result<ValidImageRequest, ApiError> {
        if self.prompt.trim().is_empty() {
            return Err(empty_string(vec![Loc::from("body"), Loc::from("prompt")]));
        }
        let chars = self.prompt.chars().count();
        if chars > MAX_PROMPT_CHARS {
            return Err(item(
                "string_too_long",
                vec![Loc::from("body"), Loc::from("prompt")],
                format!("String should have at most {MAX_PROMPT_CHARS} characters"),
                json!(format!("{chars} characters")),
                json!({"max_length": MAX_PROMPT_CHARS}),
            ));
        }
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_IMAGES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::bad_request(
                    Some("n"),
                    format!("`n` must be between 1 and {MAX_IMAGES}, not {n}."),
                ))
            }
        };
        let size = match self.size.as_deref() {
            None | Some("auto") => ImageSize::Auto,
            Some(s) => parse_size(s).ok_or_else(|| {
                ApiError::bad_request(
                    Some("size"),
                    format!("`size` must be `WIDTHxHEIGHT` (for example `512x512`) or `auto`, not `{s}`."),
                )
            })?,
        };
        if let Some(f) = self.output_format.as_deref() {
            if f != "png" {
                return Err(ApiError::bad_request(
                    Some("output_format"),
                    format!("Only `png` images are produced, not `{f}`."),
                ));
            }
        }
        if let Some(b) = self.background.as_deref() {
            if b != "auto" && b != "opaque" {
                return Err(ApiError::bad_request(
                    Some("background"),
                    format!(
                        "`background` `{b}` is not supported: the images are opaque RGB (`auto` or `opaque`)."
                    ),
                ));
            }
        }
        let steps = match self.num_inference_steps {
            None => None,
            Some(s) if (1..=MAX_STEPS as i64).contains(&s) => Some(s as usize),
            Some(s) => {
                return Err(ApiError::bad_request(
                    Some("num_inference_steps"),
                    format!("`num_inference_steps` must be between 1 and {MAX_STEPS}, not {s}."),
                ))
            }
        };
        if let Some(g) = self.guidance_scale {
            if !(0.0..=30.0).contains(&g) {
                return Err(ApiError::bad_request(
                    Some("guidance_scale"),
                    format!("`guidance_scale` must be between 0 and 30, not {g}."),
                ));
            }
        }
        Ok(ValidImageRequest {
            prompt: self.prompt,
            model: self.model.filter(|m| !m.is_empty()),
            n,
            size,
            response_format: self.response_format.unwrap_or_default(),
            seed: self.seed,
            negative_prompt: self.negative_prompt.filter(|p| !p.trim().is_empty()),
            steps,
            guidance_scale: self.guidance_scale,
        })
    }
}

/// `WIDTHxHEIGHT` with both at least 1.
fn parse_size(s: &str) -> Option<ImageSize> {
    let (w, h) = s.split_once(['x', 'X'])?;
    let (width, height) = (w.trim().parse().ok()?, h.trim().parse().ok()?);
    (width > 0 && height > 0).then_some(ImageSize::Exact { width, height })
}

/// One generated image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageData {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b64_json: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The prompt the image was made from (Hearth does not rewrite prompts).
    pub revised_prompt: Option<String>,
}

/// Answer of `POST /v1/images/generations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImagesResponse {
    pub created: i64,
    pub data: Vec<ImageData>,
    /// Extension: the size made and the seed of the first image (image `i`
    /// used `seed + i`), to reproduce it.
    pub size: String,
    pub seed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: serde_json::Value) -> Result<ValidImageRequest, ApiError> {
        serde_json::from_value::<ImageGenerationRequest>(body)
            .expect("parses")
            .validate()
    }

    #[test]
    fn defaults_and_sizes() {
        let v = req(json!({"prompt": "a cat"})).unwrap();
        assert_eq!(v.n, 1);
        assert_eq!(v.size, ImageSize::Auto);
        assert_eq!(v.response_format, ImageResponseFormat::Url);
        let v = req(json!({"prompt": "a cat", "size": "512x256", "n": 3,
                           "response_format": "b64_json", "seed": 7}))
        .unwrap();
        assert_eq!(
            v.size,
            ImageSize::Exact {
                width: 512,
                height: 256
            }
        );
        assert_eq!((v.n, v.seed), (3, Some(7)));
        assert_eq!(v.response_format, ImageResponseFormat::B64Json);
    }

    #[test]
    fn bad_input_names_the_field() {
        let e = req(json!({"prompt": ""})).unwrap_err();
        assert_eq!(e.status(), 422);
        for (body, param) in [
            (json!({"prompt": "x", "n": 9}), "n"),
            (json!({"prompt": "x", "n": 0}), "n"),
            (json!({"prompt": "x", "size": "big"}), "size"),
            (json!({"prompt": "x", "size": "0x64"}), "size"),
            (
                json!({"prompt": "x", "output_format": "jpeg"}),
                "output_format",
            ),
            (
                json!({"prompt": "x", "background": "transparent"}),
                "background",
            ),
            (
                json!({"prompt": "x", "num_inference_steps": 0}),
                "num_inference_steps",
            ),
            (
                json!({"prompt": "x", "guidance_scale": -1.0}),
                "guidance_scale",
            ),
        ] {
            let e = req(body.clone()).unwrap_err();
            assert_eq!(e.status(), 400, "{body}");
            assert_eq!(e.param(), Some(param), "{body}");
        }
        let long = "x".repeat(MAX_PROMPT_CHARS + 1);
        assert_eq!(req(json!({ "prompt": long })).unwrap_err().status(), 422);
    }
}
