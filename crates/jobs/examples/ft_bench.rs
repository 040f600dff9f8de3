//! Fine-tuning speed and memory of one in-process training run, the
//! figures `peft_lora_bench.py` prints for PEFT on the same data:
//!
//! ```text
//! cargo run --release -p hearth-jobs --example ft_bench -- GGUF JSONL [epochs] [batch] [threads]
//! ```
//!
//! Tokens are counted as on the PEFT side: every token of every sequence
//! (chat template applied) that went through the model. Prints one JSON
//! line with tokens/s, wall seconds, the last step's loss and the peak
//! resident memory of the process.

use std::time::Instant;

use hearth_api::training_data::parse_training_file;
use hearth_jobs::{load_chat_parts, BaseModel, TrainConfig, Trainer};

fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        anyhow::bail!("usage: ft_bench GGUF JSONL [epochs] [batch] [threads]");
    }
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (epochs, batch, threads) = (arg(3, 2), arg(4, 8), arg(5, 2));
    let base = BaseModel::Gguf(args[1].clone().into());
    let data = parse_training_file(&std::fs::read_to_string(&args[2])?)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let parts = load_chat_parts(&base)?;
    let cfg = TrainConfig {
        n_epochs: epochs,
        batch_size: batch,
        lora_dropout: 0.0,
        ..TrainConfig::default()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let rss_before = peak_rss_mb();
    pool.install(|| -> anyhow::Result<()> {
        let mut t = Trainer::new(
            &base,
            "bench",
            &parts.tokenizer,
            &parts.template,
            &parts.eos_ids,
            &data,
            None,
            cfg,
        )?;
        let started = Instant::now();
        let (mut tokens, mut loss) = (0f64, 0f32);
        while t.step() < t.total_steps() {
            let r = t.train_step()?;
            // tokens_per_second * seconds of the step = its tokens.
            tokens += r.real_tokens as f64;
            loss = r.train_loss;
        }
        let wall = started.elapsed().as_secs_f64();
        println!(
            "{{\"tok_s\": {:.1}, \"tokens\": {}, \"wall_s\": {:.1}, \"last_loss\": {:.3}, \"peak_rss_mb\": {}, \"rss_before_train_mb\": {}}}",
            tokens / wall,
            tokens,
            wall,
            loss,
            peak_rss_mb(),
            rss_before
        );
        Ok(())
    })
}
