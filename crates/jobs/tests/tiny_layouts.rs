//! The training forward against hearth-models' inference `Llama` on a tiny
//! random model in both layouts (Hugging Face safetensors: halves RoPE; GGUF:
//! q/k rows permuted, interleaved RoPE), and the adapter's layout: trained on
//! the GGUF base, `Trainer::adapter` (Hugging Face layout) applied to the
//! Hugging Face base gives the same logits.

mod common;

use common::{max_diff, write_tiny, CONTEXT, VOCAB};
use hearth_jobs::{BaseModel, LoraAdapter, TokenizedExample, TrainConfig, Trainer};
use hearth_models::CausalLM;

fn examples(n: usize, seed: u32) -> Vec<TokenizedExample> {
    (0..n)
        .map(|i| {
            let len = 6 + (i * 5 + seed as usize) % 12;
            let tokens: Vec<u32> = (0..len)
                .map(|j| ((i * 31 + j * 17 + seed as usize * 7) % VOCAB) as u32)
                .collect();
            let loss = (0..len).map(|j| j >= 3).collect();
            TokenizedExample { tokens, loss }
        })
        .collect()
}

fn cfg() -> TrainConfig {
    TrainConfig {
        n_epochs: 2,
        batch_size: 4,
        learning_rate: 2e-2,
        context_length: CONTEXT,
        lora_r: 4,
        lora_alpha: 8.0,
        packing: true,
        seed: 3,
        ..TrainConfig::default()
    }
}

#[test]
fn forward_matches_inference_in_both_layouts() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (hf_llama, gguf_llama) = write_tiny(dir.path())?;
    let hf = Trainer::from_tokenized(
        &BaseModel::Safetensors(dir.path().to_path_buf()),
        "tiny",
        examples(8, 1),
        vec![],
        cfg(),
    )?;
    let gg = Trainer::from_tokenized(
        &BaseModel::Gguf(dir.path().join("tiny.gguf")),
        "tiny",
        examples(8, 1),
        vec![],
        cfg(),
    )?;
    let prompt: Vec<u32> = (0..30).map(|i| (i * 13 % VOCAB) as u32).collect();
    let infer = |m: &hearth_models::Llama| -> anyhow::Result<Vec<f32>> {
        let mut cache = m.new_cache();
        Ok(m.forward(&prompt, &mut cache)?.to_vec1::<f32>()?)
    };
    let (want_hf, want_gg) = (infer(&hf_llama)?, infer(&gguf_llama)?);
    for (t, want, name) in [(&hf, &want_hf, "hf"), (&gg, &want_gg, "gguf")] {
        let bare = t.last_logits(&prompt, false)?;
        let with_b0 = t.last_logits(&prompt, true)?;
        let d = max_diff(&bare, want);
        assert!(
            d < 1e-4,
            "{name}: training forward differs from inference by {d}"
        );
        assert!(
            max_diff(&with_b0, &bare) < 1e-6,
            "{name}: B = 0 changes nothing"
        );
    }
    assert!(max_diff(&want_hf, &want_gg) < 1e-4);
    Ok(())
}

#[test]
fn gguf_trained_adapter_is_in_hf_layout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    write_tiny(dir.path())?;
    let mut gg = Trainer::from_tokenized(
        &BaseModel::Gguf(dir.path().join("tiny.gguf")),
        "tiny-base",
        examples(8, 1),
        vec![],
        cfg(),
    )?;
    let hf = Trainer::from_tokenized(
        &BaseModel::Safetensors(dir.path().to_path_buf()),
        "tiny-base",
        examples(8, 1),
        vec![],
        cfg(),
    )?;
    while gg.step() < gg.total_steps() {
        gg.train_step()?;
    }
    let prompt: Vec<u32> = (0..25).map(|i| (i * 7 % VOCAB) as u32).collect();
    let trained = gg.last_logits(&prompt, true)?;
    let bare = gg.last_logits(&prompt, false)?;
    assert!(
        max_diff(&trained, &bare) > 1e-2,
        "the adapter changes the model"
    );

    let adapter = gg.adapter()?;
    assert_eq!(adapter.config.base_model, "tiny-base");
    assert_eq!(adapter.config.targets.len(), 7);
    // The HF-layout adapter on the HF base = the GGUF-layout vars on the GGUF base.
    let on_hf = hf.last_logits_with(Some(&adapter), &prompt)?;
    let d = max_diff(&on_hf, &trained);
    assert!(d < 1e-4, "adapter moved to the HF base differs by {d}");
    // ... and through PEFT's files, on either base.
    let (bytes, json) = adapter.to_peft()?;
    let back = LoraAdapter::from_peft(&bytes, &json, common::LAYERS)?;
    assert!(max_diff(&hf.last_logits_with(Some(&back), &prompt)?, &trained) < 1e-4);
    assert!(max_diff(&gg.last_logits_with(Some(&back), &prompt)?, &trained) < 1e-5);
    // Without converting the layout, q/k would be wrong: applying the
    // GGUF-layout matrices as if they were HF's changes the logits.
    let d = gg.dims();
    let raw = adapter.permuted_for_gguf(d.heads, d.kv_heads, d.head_dim, true)?;
    assert!(max_diff(&hf.last_logits_with(Some(&raw), &prompt)?, &trained) > 1e-3);
    Ok(())
}
