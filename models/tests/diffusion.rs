//! The Stable Diffusion pipeline on the tiny random-weight folder that
//! `write_tiny_pipeline` writes.

mod common;

use candle_core::{DType, Device, Tensor, D};
use candle_transformers::models::clip::text_model::{
    Activation, ClipTextConfig, ClipTextTransformer,
};
use candle_transformers::models::stable_diffusion::{
    unet_2d::{BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig},
    vae::{AutoEncoderKL, AutoEncoderKLConfig},
};
use hearth_models::diffusion::{write_tiny_pipeline, DiffusionPipeline, ImageParams, RgbImage};
use std::path::Path;

fn tiny(seed: u64) -> anyhow::Result<(tempfile::TempDir, DiffusionPipeline)> {
    let dir = tempfile::tempdir()?;
    write_tiny_pipeline(dir.path(), seed)?;
    let pipeline = DiffusionPipeline::load(dir.path(), &Device::Cpu, DType::F32)?;
    Ok((dir, pipeline))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    assert_eq!(a.dims(), b.dims());
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

fn std_dev(a: &Tensor) -> anyhow::Result<f32> {
    let a = a.flatten_all()?;
    let mean = a.mean_all()?;
    Ok(a.broadcast_sub(&mean)?
        .sqr()?
        .mean_all()?
        .sqrt()?
        .to_scalar::<f32>()?)
}

fn vb(file: &Path) -> anyhow::Result<candle_nn::VarBuilder<'static>> {
    Ok(unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&[file], DType::F32, &Device::Cpu)?
    })
}

fn params(n: usize, seed: u64) -> ImageParams {
    ImageParams {
        prompt: "a photo of a red cat".into(),
        negative_prompt: Some("blurry".into()),
        n,
        width: 64,
        height: 64,
        steps: 2,
        guidance_scale: 7.5,
        seed,
    }
}

fn generate(p: &DiffusionPipeline, params: &ImageParams) -> anyhow::Result<Vec<RgbImage>> {
    Ok(p.generate(params, &mut |_, _| true)?)
}

/// The loaded components compute what candle-transformers' modules built
/// directly from the same files and the configs the JSON describes compute.
#[test]
fn components_match_candle_transformers_modules() -> anyhow::Result<()> {
    let (dir, p) = tiny(7)?;
    let dir = dir.path();
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir.join("text_encoder/config.json"),
    )?)?;
    let clip_config = ClipTextConfig {
        vocab_size: config["vocab_size"].as_u64().unwrap() as usize,
        embed_dim: 32,
        activation: Activation::QuickGelu,
        intermediate_size: 64,
        max_position_embeddings: 77,
        pad_with: None,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        projection_dim: 32,
    };
    let clip = ClipTextTransformer::new(
        vb(&dir.join("text_encoder/model.safetensors"))?.pp("text_model"),
        &clip_config,
    )?;
    let ids = Tensor::new(p.tokenize("a photo of a cat")?, &Device::Cpu)?.unsqueeze(0)?;
    let text = p.encode_tokens(&ids)?;
    let expected = clip.forward_with_mask(&ids, usize::MAX)?;
    assert_eq!(text.dims(), &[1, 77, 32]);
    assert!(max_abs_diff(&text, &expected)? <= 1e-5);
    assert!(std_dev(&text)? > 0.1);

    let unet_config = UNet2DConditionModelConfig {
        center_input_sample: false,
        flip_sin_to_cos: true,
        freq_shift: 0.0,
        blocks: vec![
            BlockConfig {
                out_channels: 32,
                use_cross_attn: Some(1),
                attention_head_dim: 2,
            },
            BlockConfig {
                out_channels: 64,
                use_cross_attn: None,
                attention_head_dim: 4,
            },
        ],
        layers_per_block: 1,
        downsample_padding: 1,
        mid_block_scale_factor: 1.0,
        norm_num_groups: 32,
        norm_eps: 1e-5,
        cross_attention_dim: 32,
        sliced_attention_size: None,
        use_linear_projection: false,
    };
    let unet = UNet2DConditionModel::new(
        vb(&dir.join("unet/diffusion_pytorch_model.safetensors"))?,
        4,
        4,
        false,
        unet_config,
    )?;
    let latents = (Tensor::arange(0f32, 512.0, &Device::Cpu)? * 0.37)?
        .sin()?
        .reshape((2, 4, 8, 8))?;
    let text2 = text.repeat((2, 1, 1))?;
    let noise = p.predict_noise(&latents, 500.0, &text2)?;
    let expected = unet.forward(&latents, 500.0, &text2)?;
    assert_eq!(noise.dims(), &[2, 4, 8, 8]);
    assert!(max_abs_diff(&noise, &expected)? <= 1e-5);
    assert!(std_dev(&noise)? > 1e-3);

    let vae_config = AutoEncoderKLConfig {
        block_out_channels: vec![32, 32, 64, 64],
        layers_per_block: 1,
        latent_channels: 4,
        norm_num_groups: 32,
        use_quant_conv: true,
        use_post_quant_conv: true,
    };
    let vae = AutoEncoderKL::new(
        vb(&dir.join("vae/diffusion_pytorch_model.safetensors"))?,
        3,
        3,
        vae_config,
    )?;
    let decoded = p.vae_decode(&latents)?;
    let expected = vae.decode(&latents)?;
    assert_eq!(decoded.dims(), &[2, 3, 64, 64]);
    assert!(max_abs_diff(&decoded, &expected)? <= 1e-5);
    assert!(std_dev(&decoded)? > 1e-3);
    // The two latents decode to different images.
    let per_image = decoded.flatten_from(1)?;
    let diff = (per_image.get(0)? - per_image.get(1)?)?
        .abs()?
        .max(D::Minus1)?;
    assert!(diff.to_scalar::<f32>()? > 1e-3);
    Ok(())
}

#[test]
fn tokenizer_gives_clip_ids() -> anyhow::Result<()> {
    let (dir, p) = tiny(1)?;
    let vocab: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer/vocab.json"))?,
    )?;
    let id = |t: &str| vocab[t].as_u64().unwrap() as u32;
    let (bos, eos) = (id("<|startoftext|>"), id("<|endoftext|>"));
    let mut expected = vec![
        bos,
        id("a</w>"),
        id("photo</w>"),
        id("of</w>"),
        id("a</w>"),
        id("cat</w>"),
        eos,
    ];
    expected.resize(77, eos);
    assert_eq!(p.tokenize("a photo of a cat")?, expected);
    // Lowercased, whitespace collapsed.
    assert_eq!(p.tokenize("  A \t PHOTO   of a Cat ")?, expected);
    // Unmerged words fall back to letters, the last with </w>; punctuation
    // is its own word.
    let ids = p.tokenize("xyz, dog")?;
    assert_eq!(
        &ids[..7],
        &[
            bos,
            id("x"),
            id("y"),
            id("z</w>"),
            id(",</w>"),
            id("dog</w>"),
            eos
        ]
    );
    // Long prompts are truncated to 77 with EOS last.
    let long = p.tokenize(&"cat ".repeat(200))?;
    assert_eq!(long.len(), 77);
    assert_eq!((long[0], long[75], long[76]), (bos, id("cat</w>"), eos));
    Ok(())
}

#[test]
fn generation_is_deterministic_per_seed() -> anyhow::Result<()> {
    let (_dir, p) = tiny(3)?;
    let first = generate(&p, &params(2, 42))?;
    let again = generate(&p, &params(2, 42))?;
    assert_eq!(first.len(), 2);
    for image in &first {
        assert_eq!(
            (image.width, image.height, image.pixels.len()),
            (64, 64, 64 * 64 * 3)
        );
        assert!(
            image.pixels.iter().any(|&v| v != image.pixels[0]),
            "a flat image"
        );
    }
    assert!(first == again, "the same seed gave different images");
    assert!(
        first[0] != first[1],
        "the two images of a request are equal"
    );
    // Each image runs alone through the UNet, so image 0 is exactly the
    // n=1 image, and image 1 exactly seed + 1's.
    let single = generate(&p, &params(1, 42))?;
    assert!(single[0] == first[0], "image 0 differs from the n=1 image");
    let next = generate(&p, &params(1, 43))?;
    assert!(next[0] == first[1], "image 1 is not seed + 1's image");
    let other = generate(&p, &params(1, 1234))?;
    assert!(other[0] != first[0], "another seed gave the same image");
    // Without guidance the image changes too.
    let unguided = generate(
        &p,
        &ImageParams {
            guidance_scale: 1.0,
            ..params(1, 42)
        },
    )?;
    assert!(unguided[0] != first[0], "guidance made no difference");
    Ok(())
}

#[test]
fn png_round_trips() -> anyhow::Result<()> {
    let (width, height) = (5, 3);
    let pixels = (0..width * height * 3)
        .map(|i| (i * 17 % 256) as u8)
        .collect();
    let image = RgbImage {
        width,
        height,
        pixels,
    };
    let bytes = image.to_png();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info()?;
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut buf)?;
    assert_eq!(
        (frame.width as usize, frame.height as usize),
        (width, height)
    );
    assert_eq!(frame.color_type, png::ColorType::Rgb);
    assert_eq!(frame.bit_depth, png::BitDepth::Eight);
    assert_eq!(&buf[..frame.buffer_size()], &image.pixels[..]);
    Ok(())
}

#[test]
fn sizes_and_defaults() -> anyhow::Result<()> {
    let (_dir, p) = tiny(1)?;
    assert_eq!(p.default_size(), (64, 64));
    assert_eq!(p.default_steps(), 30);
    assert_eq!(p.size_multiple(), 16);
    assert!(p.supports_size(64, 64));
    assert!(p.supports_size(16, 48));
    assert!(p.supports_size(2048, 2048));
    assert!(!p.supports_size(72, 64));
    assert!(!p.supports_size(64, 72));
    assert!(!p.supports_size(0, 64));
    assert!(!p.supports_size(64, 0));
    assert!(!p.supports_size(4096, 64));
    assert!(p.size_rule().contains("16"));
    // The largest attention of a pass: the first UNet block's 2 heads over
    // the latent's (1024 / 8)^2 pixels, scores and softmax, f32.
    let tokens = (1024u64 / 8).pow(2);
    assert_eq!(p.attention_bytes(1024, 1024), 2 * 4 * 2 * tokens * tokens);
    // Four times the area: sixteen times the memory.
    assert_eq!(
        p.attention_bytes(2048, 2048),
        16 * p.attention_bytes(1024, 1024)
    );
    let err = p
        .generate(
            &ImageParams {
                width: 72,
                ..params(1, 1)
            },
            &mut |_, _| true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("72x64"), "{err}");
    Ok(())
}

#[test]
fn on_step_false_cancels_after_the_first_step() -> anyhow::Result<()> {
    let (_dir, p) = tiny(1)?;
    let mut calls = Vec::new();
    let err = p
        .generate(
            &ImageParams {
                steps: 3,
                ..params(1, 5)
            },
            &mut |step, total| {
                calls.push((step, total));
                false
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    assert_eq!(calls, vec![(1, 3)]);
    let mut calls = Vec::new();
    generate(&p, &params(1, 5))?;
    p.generate(
        &ImageParams {
            steps: 3,
            ..params(1, 5)
        },
        &mut |step, total| {
            calls.push((step, total));
            true
        },
    )?;
    assert_eq!(calls, vec![(1, 3), (2, 3), (3, 3)]);
    Ok(())
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> anyhow::Result<()> {
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    edit(&mut value);
    std::fs::write(path, serde_json::to_string(&value)?)?;
    Ok(())
}

fn load_error(edit: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    write_tiny_pipeline(dir.path(), 1)?;
    edit(dir.path())?;
    match DiffusionPipeline::load(dir.path(), &Device::Cpu, DType::F32) {
        Ok(_) => anyhow::bail!("the edited pipeline loaded"),
        Err(e) => Ok(e.to_string()),
    }
}

#[test]
fn unsupported_configs_are_refused_by_name() -> anyhow::Result<()> {
    let err = load_error(|d| {
        edit_json(&d.join("unet/config.json"), |v| {
            v["down_block_types"][1] = "FooBlock2D".into()
        })
    })?;
    assert!(
        err.contains("FooBlock2D") && err.contains("down_block_types"),
        "{err}"
    );
    let err = load_error(|d| {
        edit_json(&d.join("unet/config.json"), |v| {
            v["addition_embed_type"] = "text_time".into()
        })
    })?;
    assert!(err.contains("addition_embed_type"), "{err}");
    let err = load_error(|d| {
        edit_json(&d.join("model_index.json"), |v| {
            v["_class_name"] = "StableDiffusionXLPipeline".into()
        })
    })?;
    assert!(err.contains("StableDiffusionXLPipeline"), "{err}");
    let err = load_error(|d| {
        edit_json(&d.join("scheduler/scheduler_config.json"), |v| {
            v["beta_schedule"] = "sigmoid".into()
        })
    })?;
    assert!(err.contains("beta_schedule"), "{err}");
    let err = load_error(|d| {
        edit_json(&d.join("text_encoder/config.json"), |v| {
            v["hidden_act"] = "gelu".into()
        })
    })?;
    assert!(err.contains("gelu"), "{err}");
    Ok(())
}

/// The pipeline on a CUDA GPU (`--features cuda`) against the CPU, from the
/// same files and seed (the noise is drawn on the CPU for both): the same
/// image up to float rounding, which may move a few pixels by a level or
/// two. Without a CUDA device it says so and passes.
#[cfg(feature = "cuda")]
#[test]
fn generation_on_the_gpu_matches_the_cpu() -> anyhow::Result<()> {
    let Some(gpu) = common::cuda() else {
        return Ok(());
    };
    let (dir, cpu) = tiny(3)?;
    let cuda = DiffusionPipeline::load(dir.path(), &gpu, DType::F32)?;
    let want = generate(&cpu, &params(1, 42))?;
    let got = generate(&cuda, &params(1, 42))?;
    let (a, b) = (&got[0].pixels, &want[0].pixels);
    assert_eq!(a.len(), b.len());
    let max_diff = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
    let off = a.iter().zip(b).filter(|(x, y)| x.abs_diff(**y) > 2).count();
    assert!(
        max_diff <= 8 && off * 100 <= a.len(),
        "the GPU's image differs: {off} values by more than 2, by up to {max_diff}"
    );
    Ok(())
}
