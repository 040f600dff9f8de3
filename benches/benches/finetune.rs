//! LoRA fine-tuning on the default chat model (SmolLM2-135M-Instruct,
//! Q4_1 GGUF dequantised to f32), rank 8 on all seven projections:
//!
//! - `finetune/step_b8x128`: one optimizer step (forward, backward, AdamW)
//!   over 8 examples of 128 tokens, loss on the second half of each;
//!   elements/s is tokens/s.
//! - `finetune/epoch_32x96`: a whole small epoch, 32 examples of 96 tokens
//!   in batches of 8 (4 steps), then the validation loss over 8 more.
//!
//! ```sh
//! cargo bench -p hearth-benches --bench finetune
//! ```
//! The model is read from `$HEARTH_DATA_DIR/models` (default: the
//! repository's `data/models`); without it the bench says so and skips.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hearth_jobs::{BaseModel, Schedule, TokenizedExample, TrainConfig, Trainer};

const MODEL: &str = "models/HuggingFaceTB--SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> PathBuf {
    std::env::var_os("HEARTH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
        .join(MODEL)
}

/// `n` examples of `len` tokens (ids spread over the vocabulary), loss on
/// the second half.
fn examples(n: usize, len: usize, seed: usize) -> Vec<TokenizedExample> {
    (0..n)
        .map(|i| TokenizedExample {
            tokens: (0..len)
                .map(|p| ((seed * 7919 + i * 104_729 + p * 31_337) % 49_000) as u32 + 100)
                .collect(),
            loss: (0..len).map(|p| p >= len / 2).collect(),
        })
        .collect()
}

fn trainer(
    base: &BaseModel,
    train: Vec<TokenizedExample>,
    valid: Vec<TokenizedExample>,
) -> Trainer {
    let cfg = TrainConfig {
        n_epochs: 1000,
        batch_size: 8,
        learning_rate: 1e-4,
        schedule: Schedule::Linear,
        context_length: 256,
        lora_r: 8,
        lora_alpha: 16.0,
        lora_dropout: 0.0,
        ..TrainConfig::default()
    };
    Trainer::from_tokenized(base, "bench", train, valid, cfg).expect("the default model loads")
}

fn bench_finetune(c: &mut Criterion) {
    hearth_benches::pin_rayon_threads();
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "finetune bench skipped: {} is missing (run `hearth models pull` first)",
            path.display()
        );
        return;
    }
    let base = BaseModel::Gguf(path);
    let mut group = c.benchmark_group("finetune");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));

    let mut t = trainer(&base, examples(8, 128, 1), Vec::new());
    group.throughput(Throughput::Elements(8 * 128));
    group.bench_function("step_b8x128", |b| {
        b.iter(|| t.train_step().expect("a training step"))
    });

    let mut t = trainer(&base, examples(32, 96, 2), examples(8, 96, 3));
    group.throughput(Throughput::Elements(32 * 96));
    group.bench_function("epoch_32x96", |b| {
        b.iter(|| {
            for _ in 0..t.steps_per_epoch() {
                t.train_step().expect("a training step");
            }
            t.validation_loss().expect("a validation loss")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_finetune);
criterion_main!(benches);
