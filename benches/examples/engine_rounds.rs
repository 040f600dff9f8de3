//! llama-bench's `tg128` and `pp512` on Hearth's engine, repeated like its
//! `-r`: for models too large for criterion's ten samples per figure (an
//! 8B decode of 128 tokens takes half a minute on two cores).
//!
//! ```sh
//! cargo run --release -p hearth-benches --example engine_rounds -- FILE.gguf [REPS [DEPTH]]
//! ```
//!
//! Prints `tg128` and `pp512` in tokens per second, mean and standard
//! deviation over REPS runs (default 3), after an unmeasured 8-token decode
//! (which pages the weights in). `tg128` is a 1-token prompt and 128
//! decoded tokens, timed from the first token to the last, as the criterion
//! `decode/B1x128` figure; `pp512` one 512-token prompt, submit to its first
//! token, as `prefill/512`. With DEPTH, the decode follows a DEPTH-token
//! prompt instead (`tg128 @ dDEPTH`, as llama-bench's `-d`: the cost of
//! attention over a long context), and `pp512 @ dDEPTH` is 512 prompt
//! tokens after DEPTH others already in the KV cache (a DEPTH-token prompt
//! is run first; the longer prompt then finds it in the prefix cache).
//! `HEARTH_BENCH_BATCHES=1,16,64` also times decoding with that many
//! sequences at once (`tg128 B16`: tokens per second over all of them;
//! default `1`). `HEARTH_BENCH_DEVICE=cuda` runs it on a GPU (build with
//! `--features cuda`). `HEARTH_BATCH_INVARIANT=1` runs the kernels as
//! `hearth serve --batch-invariant` does.

#[path = "../benches/shared/engine_run.rs"]
mod engine_run;

use std::path::PathBuf;

use anyhow::Context;
use engine_run::{decode_round, prefill_once};
use hearth_engine::load::load_gguf;
use hearth_models::BLOCK_SIZE;

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn main() -> anyhow::Result<()> {
    hearth_benches::pin_rayon_threads();
    if std::env::var_os("HEARTH_BATCH_INVARIANT").is_some_and(|v| v == "1") {
        anyhow::ensure!(
            hearth_kernels::set_batch_invariant(true),
            "the kernels ran before HEARTH_BATCH_INVARIANT was read"
        );
    }
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .context("usage: engine_rounds FILE.gguf [REPS]")?,
    );
    let reps: usize = args.next().map_or(Ok(3), |s| s.parse())?;
    let depth: usize = args.next().map_or(Ok(0), |s| s.parse())?;
    let lm = load_gguf(&path, &engine_run::bench_device()).context("loading the GGUF")?;
    let engine = engine_run::start(lm, None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let batches: Vec<usize> = std::env::var("HEARTH_BENCH_BATCHES")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        // Empty: no decode rounds (prefill alone, for a profile).
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            b.trim()
                .parse()
                .context("HEARTH_BENCH_BATCHES: comma-separated sizes")
        })
        .collect::<anyhow::Result<_>>()?;
    let name = path
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    // Each figure is printed as soon as it is measured.
    let report = |test: String, xs: &[f64]| {
        let (mean, sd) = mean_sd(xs);
        println!("{name} | {test} | {mean:.2} ± {sd:.2} tok/s");
    };
    decode_round(&rt, &engine, 1, 1, 8);
    for &b in &batches {
        // Unmeasured: a GPU compiles each kernel (per batch shape) once.
        decode_round(&rt, &engine, b, depth.max(1), 2);
        let xs: Vec<f64> = (0..reps)
            .map(|_| {
                let t = decode_round(&rt, &engine, b, depth.max(1), 128);
                (b * 128) as f64 / t.as_secs_f64()
            })
            .collect();
        let mut test = "tg128".to_string();
        if b != 1 {
            test += &format!(" B{b}");
        }
        if depth > 0 {
            test += &format!(" @ d{depth}");
        }
        report(test, &xs);
    }
    if depth == 0 {
        prefill_once(&rt, &engine, reps + 1, 512);
        let xs: Vec<f64> = (1..=reps)
            .map(|seq| 512.0 / prefill_once(&rt, &engine, seq, 512).as_secs_f64())
            .collect();
        report("pp512".into(), &xs);
    } else {
        // Sequences of their own (the decode rounds used 0..b).
        let xs = (1..=reps + 1)
            .map(|rep| {
                let seq = 1000 + rep;
                prefill_once(&rt, &engine, seq, depth);
                let hits = engine.prefix_hit_blocks();
                let t = prefill_once(&rt, &engine, seq, depth + 512);
                let cached = (engine.prefix_hit_blocks() - hits) * BLOCK_SIZE;
                anyhow::ensure!(
                    cached >= depth,
                    "only {cached} of the {depth} positions came from the prefix cache"
                );
                Ok(512.0 / t.as_secs_f64())
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        // The first, unmeasured: as `pp512`'s.
        report(format!("pp512 @ d{depth}"), &xs[1..]);
    }
    Ok(())
}
