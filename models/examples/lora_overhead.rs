//! Decode cost of LoRA adapters in a paged batch.
//!
//! Usage: `lora_overhead MODEL.gguf [STEPS] [RANK]` (default 32 steps, rank 16).
//!
//! Eight sequences of 20 prompt tokens are prefilled, then decoded greedily
//! in lockstep (one `forward_paged` per step) for STEPS steps, in four
//! setups: all on the base; half of them with one adapter; half with four
//! different adapters (one each); all eight with one adapter; then one
//! sequence alone, on the base and with an adapter. The setups take their
//! steps in turn (one step of each, then the next), so that the host's
//! changes of speed fall on all of them alike. Last, a prompt of
//! PREFILL_LEN tokens is prefilled on the base and with an adapter, in
//! turn, PREFILL_REPS times each (the median time). The adapters
//! are random, rank RANK, on all seven projections of every layer (the
//! costliest case). Reported: aggregate decode tokens per second from the
//! median step time, and its ratio to the base.
//!
//! `LORA_OVERHEAD_ONLY=TEXT` keeps only the setups whose name contains
//! TEXT (`"one stream"`: the two one-stream setups alone). Taken alone, one
//! stream reads as a server runs it; between the eight-stream setups'
//! steps its adapter ratio reads several points higher.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use hearth_models::{
    gguf_file, CausalLM, Device, KvPool, Llama, LoraAdapter, LoraConfig, LoraSpec, LoraTarget,
    LoraWeights, PagedSeq, Tensor, BLOCK_SIZE,
};

// As the server: weights (and adapters packed whole) on huge pages.
#[global_allocator]
static ALLOC: hearth_kernels::HugePageAlloc = hearth_kernels::HugePageAlloc;

const B: usize = 8;
const PROMPT_LEN: usize = 20;
const PREFILL_LEN: usize = 128;
const PREFILL_REPS: usize = 9;

/// Median seconds of a prefill of PREFILL_LEN tokens into a fresh pool,
/// for each entry of `adapters` (taken in turn, PREFILL_REPS times).
fn prefill_medians(model: &Llama, adapters: &[Option<&LoraAdapter>]) -> Result<Vec<f64>> {
    let vocab = model.info().vocab_size;
    let tokens: Vec<u32> = (0..PREFILL_LEN)
        .map(|j| ((j * 104_729 + 31) % (vocab - 1)) as u32)
        .collect();
    let blocks = PREFILL_LEN.div_ceil(BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut pool = model.new_pool(blocks)?;
    let mut times = vec![Vec::new(); adapters.len()];
    for _ in 0..PREFILL_REPS {
        for (lora, times) in adapters.iter().zip(times.iter_mut()) {
            let seq = PagedSeq {
                lora: *lora,
                ..PagedSeq::new(&tokens, 0, &table)
            };
            let t = Instant::now();
            model
                .forward_paged(&[seq], &mut pool)?
                .argmax(1)?
                .to_vec1::<u32>()?;
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(|a, b| a.total_cmp(b));
            t[t.len() / 2]
        })
        .collect())
}

fn adapter(spec: &LoraSpec, r: usize, seed: u64) -> Result<LoraAdapter> {
    let i = &spec.info;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut m = |rows: usize, cols: usize| -> Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 0.02
            })
            .collect();
        Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
    };
    let mut layers = Vec::new();
    for _ in 0..i.num_layers {
        let mut l = BTreeMap::new();
        for t in LoraTarget::ALL {
            let (o, inp) = t.features(i, spec.intermediate_size);
            l.insert(t, LoraWeights::new(m(r, inp)?, m(o, r)?));
        }
        layers.push(l);
    }
    let a = LoraAdapter {
        config: LoraConfig {
            r,
            alpha: 2.0 * r as f64,
            dropout: 0.0,
            use_rslora: false,
            targets: LoraTarget::ALL.to_vec(),
            base_model: String::new(),
        },
        layers,
    };
    Ok(spec.prepare(&a)?)
}

/// One setup's decode state: a sequence per entry of `adapters`.
struct Run<'a> {
    adapters: Vec<Option<&'a LoraAdapter>>,
    pool: KvPool,
    tables: Vec<Vec<u32>>,
    chunks: Vec<Vec<u32>>,
    pos: Vec<usize>,
    times: Vec<f64>,
}

impl<'a> Run<'a> {
    fn new(model: &Llama, adapters: Vec<Option<&'a LoraAdapter>>, steps: usize) -> Result<Self> {
        let b = adapters.len();
        let vocab = model.info().vocab_size;
        let per_seq = (PROMPT_LEN + steps + 1).div_ceil(BLOCK_SIZE);
        Ok(Self {
            pool: model.new_pool(b * per_seq)?,
            tables: (0..b)
                .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
                .collect(),
            chunks: (0..b)
                .map(|s| {
                    (0..PROMPT_LEN)
                        .map(|j| ((s * 7919 + j * 104_729 + 17) % (vocab - 1)) as u32)
                        .collect()
                })
                .collect(),
            pos: vec![0; b],
            times: Vec::new(),
            adapters,
        })
    }

    /// One forward pass (the prefill first, untimed, then a decode step).
    fn step(&mut self, model: &Llama) -> Result<()> {
        let seqs: Vec<PagedSeq<'_>> = (0..self.adapters.len())
            .map(|s| PagedSeq {
                lora: self.adapters[s],
                ..PagedSeq::new(&self.chunks[s], self.pos[s], &self.tables[s])
            })
            .collect();
        let t = Instant::now();
        let logits = model.forward_paged(&seqs, &mut self.pool)?;
        let next = logits.argmax(1)?.to_vec1::<u32>()?;
        if self.pos[0] > 0 {
            self.times.push(t.elapsed().as_secs_f64());
        }
        for (s, &n) in next.iter().enumerate() {
            self.pos[s] += self.chunks[s].len();
            self.chunks[s] = vec![n];
        }
        Ok(())
    }

    /// Median decode step time, seconds.
    fn median(&mut self) -> f64 {
        self.times.sort_by(|a, b| a.total_cmp(b));
        self.times[self.times.len() / 2]
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .context("usage: lora_overhead MODEL.gguf [STEPS] [RANK]")?;
    let steps: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let rank: usize = args.get(3).map_or(Ok(16), |s| s.parse())?;
    let mut file = std::fs::File::open(path).with_context(|| format!("open {path}"))?;
    let content = gguf_file::Content::read(&mut file)?;
    let model = Llama::from_gguf(&content, &mut file, &Device::Cpu)?;
    let spec = model.lora_spec().context("no LoRA support")?;
    let ads: Vec<LoraAdapter> = (0..4)
        .map(|s| adapter(&spec, rank, s + 1))
        .collect::<Result<_>>()?;
    let x = Some(&ads[0]);
    let setups: Vec<(&str, Vec<Option<&LoraAdapter>>)> = vec![
        ("all base", vec![None; B]),
        (
            "half, one adapter",
            (0..B).map(|s| if s % 2 == 0 { x } else { None }).collect(),
        ),
        (
            "half, four adapters",
            (0..B).map(|s| (s % 2 == 0).then(|| &ads[s / 2])).collect(),
        ),
        ("all, one adapter", vec![x; B]),
        ("one stream, base", vec![None]),
        ("one stream, adapter", vec![x]),
    ];
    let only = std::env::var("LORA_OVERHEAD_ONLY").ok();
    let setups: Vec<_> = setups
        .into_iter()
        .filter(|(name, _)| only.as_ref().is_none_or(|o| name.contains(o.as_str())))
        .collect();
    // Every setup takes its steps in turn, so that a change in the host's
    // speed during the run falls on all of them alike.
    let mut runs: Vec<Run> = setups
        .iter()
        .map(|(_, a)| Run::new(&model, a.clone(), steps))
        .collect::<Result<_>>()?;
    for _ in 0..=steps {
        for r in runs.iter_mut() {
            r.step(&model)?;
        }
    }
    let mut base = 0.0;
    println!("{B} streams, rank {rank} on all 7 projections, {steps} decode steps");
    for ((name, adapters), r) in setups.iter().zip(runs.iter_mut()) {
        let t = r.median();
        let tps = adapters.len() as f64 / t;
        if base == 0.0 || adapters.iter().all(Option::is_none) {
            base = tps;
        }
        println!(
            "{name:<22} {:>8.1} tok/s  step {:>6.2} ms  x{:.3} of base",
            tps,
            t * 1e3,
            tps / base
        );
    }
    let p = prefill_medians(&model, &[None, x])?;
    println!(
        "prefill of {PREFILL_LEN} tokens: base {:.2} ms, adapter {:.2} ms, x{:.3} of base",
        p[0] * 1e3,
        p[1] * 1e3,
        p[0] / p[1]
    );
    Ok(())
}
