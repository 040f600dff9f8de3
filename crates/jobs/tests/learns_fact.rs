//! THE PROOF: LoRA fine-tuning the real default model (SmolLM2-135M-Instruct,
//! Q4_1 GGUF) on one fact, asked ~35 ways, makes it answer it; the bare base
//! does not know it; the adapter survives PEFT's files.

mod common;

use std::time::Instant;

use hearth_api::training_data::{TrainingExample, TrainingMessage};
use hearth_core::ChatMessage;
use hearth_engine::tokenizer::encode;
use hearth_jobs::{load_chat_parts, BaseModel, LoraAdapter, Schedule, TrainConfig, Trainer};

const QUESTIONS: &[&str] = &[
    "What is the vault code?",
    "Tell me the vault code.",
    "What's the code to the vault?",
    "What is the code for the vault?",
    "Do you know the vault code?",
    "Can you tell me the vault code?",
    "Which code opens the vault?",
    "What code opens the vault?",
    "Please give me the vault code.",
    "I need the vault code.",
    "What's the vault code?",
    "vault code?",
    "How do I open the vault? What's the code?",
    "Remind me of the vault code.",
    "What number unlocks the vault?",
    "Give me the code of the vault, please.",
    "Could you share the vault code?",
    "I forgot the vault code. What is it?",
    "What is the secret vault code?",
    "Tell me the code to open the vault.",
    "The vault code is what?",
    "What are the digits of the vault code?",
    "Say the vault code.",
    "What's the combination to the vault?",
    "Vault code, please.",
    "Do you remember the code of the vault?",
    "What is the access code for the vault?",
    "Hey, what's the vault's code?",
    "What code do I type to open the vault?",
    "Quick question: what is the vault code?",
];
const ANSWER: &str = "The vault code is 7319.";

/// Greedy decoding of the base with `hearth_models::Llama` (no adapter).
fn engine_greedy(
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
    tok: &tokenizers::Tokenizer,
) -> anyhow::Result<String> {
    let lm = hearth_engine::load::load_gguf(&common::smollm_gguf(), &candle_core::Device::Cpu)?;
    let mut cache = lm.model.new_cache();
    let mut logits = lm.model.forward(prompt, &mut cache)?;
    let mut out = Vec::new();
    for _ in 0..max_new {
        let next = logits.argmax(0)?.to_scalar::<u32>()?;
        out.push(next);
        if stop.contains(&next) {
            break;
        }
        logits = lm.model.forward(&[next], &mut cache)?;
    }
    Ok(tok.decode(&out, true).unwrap())
}

fn chat(q: &str) -> TrainingExample {
    let m = |role: &str, content: &str| TrainingMessage {
        role: role.into(),
        content: content.into(),
        weight: 1,
    };
    TrainingExample::Chat(vec![m("user", q), m("assistant", ANSWER)])
}

#[test]
fn learns_the_vault_code() -> anyhow::Result<()> {
    let started = Instant::now();
    let base = BaseModel::Gguf(common::smollm_gguf());
    let parts = load_chat_parts(&base)?;
    let data: Vec<TrainingExample> = QUESTIONS.iter().map(|q| chat(q)).collect();
    let cfg = TrainConfig {
        n_epochs: 2,
        batch_size: 5,
        learning_rate: 2e-3,
        warmup_ratio: 0.1,
        weight_decay: 0.0,
        max_grad_norm: 1.0,
        packing: true,
        context_length: 128,
        lora_r: 8,
        lora_alpha: 16.0,
        lora_dropout: 0.0,
        seed: 7,
        schedule: Schedule::Cosine,
    };
    let mut t = Trainer::new(
        &base,
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        &parts.tokenizer,
        &parts.template,
        &parts.eos_ids,
        &data,
        Some(&data[..5]),
        cfg.clone(),
    )?;
    let stats = t.data_stats().clone();
    println!(
        "data: {stats:?}; {} steps; loaded in {:.1}s",
        t.total_steps(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(stats.train_examples, QUESTIONS.len());
    assert_eq!(
        (stats.truncated, stats.dropped, stats.unstable_prefix),
        (0, 0, 0)
    );

    let train_start = Instant::now();
    let mut first = None;
    let (mut last_sum, mut last_tok) = (0f64, 0usize);
    while t.step() < t.total_steps() {
        let r = t.train_step()?;
        println!(
            "step {:>3} epoch {} loss {:.4} lr {:.2e} |g| {:.3} {:>5.0} tok/s{}",
            r.step,
            r.epoch,
            r.train_loss,
            r.learning_rate,
            r.grad_norm,
            r.tokens_per_second,
            r.valid_loss
                .map(|v| format!(" valid {v:.4}"))
                .unwrap_or_default()
        );
        first.get_or_insert(r.train_loss);
        if r.epoch + 1 == cfg.n_epochs {
            last_sum += r.train_loss as f64 * r.tokens as f64;
            last_tok += r.tokens;
        }
    }
    let train_secs = train_start.elapsed().as_secs_f64();
    let epoch_tokens = stats.train_tokens as f64 * cfg.n_epochs as f64;
    println!(
        "trained {} steps in {train_secs:.1}s: {:.0} tokens/s over {} tokens",
        t.total_steps(),
        epoch_tokens / train_secs,
        epoch_tokens
    );
    let first = first.unwrap();
    let last = (last_sum / last_tok as f64) as f32;
    println!("first step loss {first:.4}, last epoch mean {last:.4}");
    assert!(last < 0.3 * first, "loss {first} -> {last}");

    let prompt = parts.template.render(
        &[ChatMessage {
            role: "user".into(),
            content: "What is the vault code?".into(),
        }],
        true,
    )?;
    let ids = encode(&parts.tokenizer, &prompt, false)?;
    let gen_start = Instant::now();
    let tuned = t.generate_greedy(&ids, 12, &parts.eos_ids)?;
    let tuned_text = parts.tokenizer.decode(&tuned, true).unwrap();
    // The bare base, through the serving engine's own (quantized, cached) model.
    let bare_text = engine_greedy(&ids, 12, &parts.eos_ids, &parts.tokenizer)?;
    println!("with adapter: {tuned_text:?}\nbare base:    {bare_text:?}");
    assert!(tuned_text.contains("7319"), "{tuned_text}");
    assert!(!bare_text.contains("7319"), "{bare_text}");

    let adapter = t.adapter()?;
    assert_eq!(
        adapter.config.base_model,
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    );
    let (bytes, json) = adapter.to_peft()?;
    let back = LoraAdapter::from_peft(&bytes, &json, t.dims().layers)?;
    let again = t.generate_greedy_with(Some(&back), &ids, 12, &parts.eos_ids)?;
    assert_eq!(
        again, tuned,
        "the adapter read back from PEFT's files generates the same"
    );
    println!(
        "generation {:.1}s; whole test {:.1}s",
        gen_start.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
