//! Lockstep decode throughput: one `forward_paged` per step over B sequences
//! sharing one KV pool
//! against B separate `forward` calls per step.
//!
//! Usage: `batch_throughput MODEL.gguf [STEPS]` (default 32 decode steps).
//!
//! For each B in 1, 4, 8, 16 and each mode, B fresh sequences of 20 prompt
//! tokens (different per sequence) are prefilled, then decoded greedily for
//! STEPS steps; the figure is aggregate decode tokens per second, B over the
//! median step time (the median rides out other load on a shared machine),
//! and decode tokens per CPU-second of the process (all threads, from
//! `/proc/self/task/*/schedstat`), less sensitive to other processes' load.
//! Prefill is timed too (best of three): the B prompts in one
//! `forward_paged` versus one `forward` each. Greedy tokens of the two modes
//! are compared (the f16 cache may flip a near tie, rarely).
//! `BATCH_SIZES=1,16` picks other batch sizes.

use std::time::Instant;

use anyhow::{Context, Result};
use hearth_models::{
    gguf_file, CausalLM, Device, KvCache, KvPool, Llama, PagedSeq, Tensor, BLOCK_SIZE,
};

const PROMPT_LEN: usize = 20;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Batched,
    Separate,
}

fn prompt(seq: usize, vocab: usize) -> Vec<u32> {
    (0..PROMPT_LEN)
        .map(|j| ((seq * 7919 + j * 104_729 + 17) % (vocab - 1)) as u32)
        .collect()
}

/// Greedy next token of each row of `[B, vocab]` logits.
fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(1)?.to_vec1::<u32>()?)
}

/// The KV state of B sequences: one shared pool with a block table each
/// (batched mode), or one cache each (separate mode).
struct Caches {
    pool: KvPool,
    tables: Vec<Vec<u32>>,
    pos: Vec<usize>,
    caches: Vec<KvCache>,
}

impl Caches {
    fn new(model: &Llama, b: usize, max_tokens: usize) -> Result<Self> {
        let per_seq = max_tokens.div_ceil(BLOCK_SIZE);
        Ok(Self {
            pool: model.new_pool(b * per_seq)?,
            tables: (0..b)
                .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
                .collect(),
            pos: vec![0; b],
            caches: (0..b).map(|_| model.new_cache()).collect(),
        })
    }
}

/// One step over all sequences in `mode`: logits `[B, vocab]`.
fn step(model: &Llama, mode: Mode, tokens: &[Vec<u32>], kv: &mut Caches) -> Result<Tensor> {
    Ok(match mode {
        Mode::Batched => {
            let seqs: Vec<PagedSeq<'_>> = tokens
                .iter()
                .zip(&kv.tables)
                .zip(&kv.pos)
                .map(|((t, blocks), &pos)| PagedSeq {
                    tokens: t,
                    pos,
                    blocks,
                    lora: None,
                })
                .collect();
            let logits = model.forward_paged(&seqs, &mut kv.pool)?;
            for (p, t) in kv.pos.iter_mut().zip(tokens) {
                *p += t.len();
            }
            logits
        }
        Mode::Separate => {
            let rows = tokens
                .iter()
                .zip(kv.caches.iter_mut())
                .map(|(t, c)| model.forward(t, c))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::stack(&rows, 0)?
        }
    })
}

/// CPU seconds used so far by all threads of this process (Linux
/// `/proc/self/task/*/schedstat`; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// Seconds to prefill `b` fresh prompts in `mode`.
fn prefill_time(model: &Llama, mode: Mode, b: usize) -> Result<f64> {
    let vocab = model.info().vocab_size;
    let mut kv = Caches::new(model, b, PROMPT_LEN)?;
    let prompts: Vec<Vec<u32>> = (0..b).map(|i| prompt(i, vocab)).collect();
    let t0 = Instant::now();
    step(model, mode, &prompts, &mut kv)?;
    Ok(t0.elapsed().as_secs_f64())
}

struct Timing {
    prefill: f64,
    /// Median wall time of one decode step.
    step: f64,
    /// CPU seconds of all decode steps (every thread).
    cpu: f64,
}

fn run(model: &Llama, mode: Mode, b: usize, steps: usize) -> Result<(Timing, Vec<Vec<u32>>)> {
    let vocab = model.info().vocab_size;
    let mut kv = Caches::new(model, b, PROMPT_LEN + steps + 1)?;
    let prompts: Vec<Vec<u32>> = (0..b).map(|i| prompt(i, vocab)).collect();
    let t0 = Instant::now();
    let logits = step(model, mode, &prompts, &mut kv)?;
    let mut next = argmax_rows(&logits)?;
    let prefill = t0.elapsed().as_secs_f64();

    let mut out: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    let mut times = Vec::with_capacity(steps);
    let cpu0 = cpu_seconds();
    for _ in 0..steps {
        let t0 = Instant::now();
        let tokens: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
        next = argmax_rows(&step(model, mode, &tokens, &mut kv)?)?;
        times.push(t0.elapsed().as_secs_f64());
        for (o, &t) in out.iter_mut().zip(&next) {
            o.push(t);
        }
    }
    let cpu = cpu_seconds() - cpu0;
    times.sort_by(f64::total_cmp);
    let step = times[times.len() / 2];
    Ok((Timing { prefill, step, cpu }, out))
}

fn main() -> Result<()> {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    let args: Vec<String> = std::env::args().collect();
    let (model_path, steps) = match args.as_slice() {
        [_, m] => (m, 32),
        [_, m, s] => (m, s.parse().context("STEPS must be a number")?),
        _ => anyhow::bail!("usage: batch_throughput MODEL.gguf [STEPS]"),
    };
    let device = Device::Cpu;
    let mut file = std::fs::File::open(model_path).with_context(|| format!("open {model_path}"))?;
    let content = gguf_file::Content::read(&mut file)?;
    let model = Llama::from_gguf(&content, &mut file, &device)?;
    println!(
        "threads {}, {} decode steps after {PROMPT_LEN}-token prompts",
        rayon_threads(),
        steps
    );
    // Warm up (page in the weights, allocate).
    run(&model, Mode::Batched, 2, 2)?;

    println!(
        "{:>3} | {:>13} {:>13} {:>6} | {:>13} {:>13} {:>6} | {:>10} {:>10} {:>6} | greedy",
        "B",
        "batched tok/s",
        "separate",
        "ratio",
        "batched tok/cpu-s",
        "separate",
        "ratio",
        "batched pf",
        "separate",
        "ratio"
    );
    let sizes: Vec<usize> = match std::env::var("BATCH_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()
            .context("BATCH_SIZES: comma-separated numbers")?,
        Err(_) => vec![1, 4, 8, 16],
    };
    for b in sizes {
        let (mut tb, gb) = run(&model, Mode::Batched, b, steps)?;
        let (mut ts, gs) = run(&model, Mode::Separate, b, steps)?;
        // A prefill is one short call: keep the best of three, interleaved.
        for _ in 0..2 {
            tb.prefill = tb.prefill.min(prefill_time(&model, Mode::Batched, b)?);
            ts.prefill = ts.prefill.min(prefill_time(&model, Mode::Separate, b)?);
        }
        let per_cpu = |t: &Timing| (b * steps) as f64 / t.cpu;
        let pf = |t: &Timing| (b * PROMPT_LEN) as f64 / t.prefill;
        let same = gb
            .iter()
            .zip(&gs)
            .map(|(x, y)| x.iter().zip(y).take_while(|(a, b)| a == b).count())
            .sum::<usize>();
        println!(
            "{b:>3} | {:>13.1} {:>13.1} {:>5.2}x | {:>13.1} {:>13.1} {:>5.2}x | {:>10.1} {:>10.1} {:>5.2}x | {same}/{} agree",
            b as f64 / tb.step,
            b as f64 / ts.step,
            ts.step / tb.step,
            per_cpu(&tb),
            per_cpu(&ts),
            per_cpu(&tb) / per_cpu(&ts),
            pf(&tb),
            pf(&ts),
            ts.prefill / tb.prefill,
            b * (steps + 1)
        );
    }
    Ok(())
}

fn rayon_threads() -> String {
    std::env::var("RAYON_NUM_THREADS").unwrap_or_default()
}
