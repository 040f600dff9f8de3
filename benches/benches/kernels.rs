//! Criterion benches of the CPU building blocks of a decode step:
//!
//! - `matmul/<format>/M<m>`: `hearth-kernels`' quantized matmul per GGUF
//!   format and activation row count (M = 1, 4, 16, 64, 256) on SmolLM2-135M's
//!   feed-forward shapes (`[1536, 576]` for the 32-value formats, `[576,
//!   1536]` for the K-quants, whose rows must be whole 256-value
//!   super-blocks), with the fastest instruction set of this CPU; throughput
//!   in elements = multiply-adds (`m n k`).
//! - `stream/<format>`: one activation row through distinct `[14336,
//!   4096]` matrices of 1 GiB in all per iteration, whose weights thus
//!   come from memory as in the decode step of a model larger than the
//!   caches; throughput in bytes of the GGUF blocks.
//! - `memory/read`: this machine's read bandwidth, the limit of a decode
//!   step whose weights do not fit the caches: a 1 GiB buffer summed by
//!   every thread of the pool, each its own contiguous part; throughput in
//!   bytes. Measured beside the model figures, it says what fraction of
//!   the limit a decode reaches.
//! - `dense_f32/<n>x<k>/M<m>`: `F32Matrix` (the encoders' f32 dense
//!   layers on AVX2 + FMA CPUs) on all-MiniLM-L6-v2's shapes (QKV `[1152,
//!   384]`, FFN `[1536, 384]` and `[384, 1536]`) for 208 and 832 rows
//!   (batches of 8 and 32 sentences of 26 tokens), as the encoder calls
//!   it: inputs regrouped by tiles, sums from a bias, and the first FFN
//!   matrix's output through GELU into tiles; throughput in elements =
//!   floating-point operations (`2 m n k`), to set beside the CPU's FMA
//!   peak. Skipped on CPUs without AVX2 and FMA.
//! - `dense_i16/<n>x<k>/M<m>`: `I16Matrix` (the encoders' `int16`
//!   arithmetic) on the same shapes and calls, the activations' rounding
//!   included; the same operation count, so the two groups' figures
//!   compare directly.
//! - `paged_attention/decode/B<b>`: one new query row for each of B
//!   sequences over 512 cached positions each (SmolLM2's 9 query heads, 3 KV
//!   heads, head_dim 64, f16 pool), keys/values written then attended, as one
//!   layer of a decode step; throughput in sequences.
//! - `paged_attention/prefill/<rows>`: a chunk of new rows of one sequence
//!   over 512 cached positions (chunked prefill); throughput in rows.
//!
//! ```sh
//! cargo bench -p hearth-benches --bench kernels
//! cargo bench -p hearth-benches --bench kernels -- matmul/Q4_1
//! ```

use std::time::Duration;

/// `memory/read` on huge pages, as the server's weights are
/// (`HEARTH_HUGE_PAGES=0`: ordinary pages).
#[global_allocator]
static ALLOC: hearth_kernels::HugePageAlloc = hearth_kernels::HugePageAlloc;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use hearth_kernels::{
    Activation, F32Matrix, Format, I16Matrix, Input, Output, PackedMatrix, QuantMatrix, Start,
    TiledRows,
};
use hearth_models::{paged_attention_step, DType, KvPool, PagedSeq, BLOCK_SIZE};

const ROWS: [usize; 5] = [1, 4, 16, 64, 256];
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const CACHED: usize = 512;

/// xorshift64: deterministic filler.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }
}

/// Random block bytes with every f16 scale field set to a small normal
/// value, so no block decodes to inf/NaN (speed does not depend on values).
fn random_blocks(format: Format, blocks: usize) -> Vec<u8> {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let mut bytes: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| rng.next() as u8)
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match format {
        Format::Q4_0 | Format::Q5_0 | Format::Q8_0 => &[0],
        Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K => &[0, 2],
        Format::Q2K => &[80, 82],
        Format::Q3K => &[108],
        Format::Q6K => &[208],
    };
    for b in bytes.chunks_exact_mut(format.block_bytes()) {
        for &f in fields {
            b[f..f + 2].copy_from_slice(&scale);
        }
    }
    bytes
}

fn configure(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
}

fn bench_matmul(c: &mut Criterion) {
    let mut rng = Rng(7);
    for format in Format::ALL {
        let (n, k) = if format.block_values() == 256 {
            (576, 1536)
        } else {
            (1536, 576)
        };
        let bytes = random_blocks(format, n * k / format.block_values());
        let q = QuantMatrix::new(format, &bytes, n, k).expect("valid shape");
        let mut group = c.benchmark_group(format!("matmul/{format:?}"));
        configure(&mut group);
        for m in ROWS {
            let x = rng.f32s(m * k);
            let mut out = vec![0f32; m * n];
            group.throughput(Throughput::Elements((m * n * k) as u64));
            group.bench_function(format!("M{m}"), |b| {
                b.iter_custom(|iters| in_pool(|| time(iters, || q.matmul(&x, m, &mut out))))
            });
        }
        group.finish();
    }
}

/// The f32 and int16 kernels on the encoder's shapes, as the encoder
/// calls them (see the module docs).
fn bench_dense(c: &mut Criterion) {
    if !F32Matrix::is_supported() {
        eprintln!("dense_f32, dense_i16: this CPU has no AVX2 and FMA");
        return;
    }
    let mut rng = Rng(5);
    for (n, k) in [(1152, 384), (1536, 384), (384, 1536)] {
        let values = rng.f32s(n * k);
        let bias = rng.f32s(n);
        let f32 = F32Matrix::new(&values, n, k).expect("valid shape");
        let i16 = I16Matrix::new(&values, n, k).expect("valid shape");
        let kernels = [
            ("f32", PackedMatrix::F32(&f32)),
            ("i16", PackedMatrix::I16(&i16)),
        ];
        for m in [208, 832] {
            let mut x = TiledRows::new();
            x.pack(&rng.f32s(m * k), k);
            let mut rows = vec![0f32; m * n];
            let mut tiled = TiledRows::new();
            for (name, w) in &kernels {
                let mut group = c.benchmark_group(format!("dense_{name}/{n}x{k}"));
                configure(&mut group);
                group.throughput(Throughput::Elements((2 * m * n * k) as u64));
                group.bench_function(format!("M{m}"), |b| {
                    b.iter_custom(|iters| {
                        in_pool(|| {
                            time(iters, || {
                                let (x, start) = (Input::Tiled(&x), Start::Bias(&bias));
                                // The first feed-forward matrix feeds the
                                // second: tiled, through GELU.
                                if n == 1536 {
                                    let out = Output::Tiled(&mut tiled);
                                    w.matmul(x, m, start, Activation::GeluErf, out)
                                } else {
                                    let out = Output::Rows(&mut rows);
                                    w.matmul(x, m, start, Activation::None, out)
                                }
                            })
                        })
                    })
                });
                group.finish();
            }
        }
    }
}

/// The shape of the `stream` matrices (Llama-3.1-8B's feed-forward `gate`
/// and `up`), and the bytes of GGUF blocks a pass reads at least: as many
/// distinct matrices as make 1 GiB (as `memory/read`'s buffer), far past
/// any last-level cache, as a decode step's weights are. Matrices of
/// that size lie on huge pages as the model's do; 12 of `[2048, 4096]`
/// (the earlier set, 50-110 MB) were partly in an Intel Xeon's 480 MB L3
/// and only partly on huge pages.
const STREAM_SHAPE: (usize, usize) = (14336, 4096);
const STREAM_BYTES: usize = 1 << 30;

/// One activation row through many distinct matrices, so that the weights
/// come from memory every time (a decode step of a model larger than the
/// caches): throughput in bytes of the GGUF blocks read. A format's
/// matrices are made only when its figure runs (they take a gigabyte).
fn bench_stream(c: &mut Criterion) {
    let (n, k) = STREAM_SHAPE;
    let mut rng = Rng(11);
    let x = rng.f32s(k);
    let mut out = vec![0f32; n];
    let mut group = c.benchmark_group("stream");
    configure(&mut group);
    for format in Format::ALL {
        let blocks = n * k / format.block_values();
        let count = STREAM_BYTES.div_ceil(blocks * format.block_bytes());
        let mut mats: Vec<QuantMatrix> = Vec::new();
        group.throughput(Throughput::Bytes(
            (count * blocks * format.block_bytes()) as u64,
        ));
        group.bench_function(format!("{format:?}"), |b| {
            if mats.is_empty() {
                // Distinct copies of one random matrix: the bytes, not
                // their values, decide the speed.
                let bytes = random_blocks(format, blocks);
                mats = (0..count)
                    .map(|_| QuantMatrix::new(format, &bytes, n, k).expect("valid shape"))
                    .collect();
            }
            b.iter_custom(|iters| {
                in_pool(|| {
                    time(iters, || {
                        for m in &mats {
                            m.matmul(&x, 1, &mut out);
                        }
                    })
                })
            })
        });
    }
    group.finish();
}

/// Bytes of the `memory/read` buffer: far beyond any last-level cache.
const MEMORY_BYTES: usize = 1 << 30;

/// Sums `part` with eight independent accumulators (no dependency chain
/// limiting the rate), vectorised for AVX2 where the CPU has it (wider loads
/// than the baseline's SSE2 reach a higher rate).
fn sum_words(part: &[u64]) -> u64 {
    #[inline(always)]
    fn body(part: &[u64]) -> u64 {
        let mut acc = [0u64; 8];
        let chunks = part.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for (a, &w) in acc.iter_mut().zip(c) {
                *a = a.wrapping_add(w);
            }
        }
        let tail: u64 = rest.iter().fold(0, |a, &w| a.wrapping_add(w));
        acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        fn fast(part: &[u64]) -> u64 {
            body(part)
        }
        // SAFETY: the CPU has AVX2.
        return unsafe { fast(part) };
    }
    body(part)
}

fn bench_memory(c: &mut Criterion) {
    use rayon::prelude::*;
    let words: Vec<u64> = (0..MEMORY_BYTES / 8).map(|i| i as u64 * 7919).collect();
    let parts = rayon::current_num_threads();
    let per = words.len().div_ceil(parts);
    let mut group = c.benchmark_group("memory");
    configure(&mut group);
    group.throughput(Throughput::Bytes(MEMORY_BYTES as u64));
    group.bench_function("read", |b| {
        b.iter(|| {
            let total: u64 = words
                .par_chunks(per)
                .map(sum_words)
                .reduce(|| 0, u64::wrapping_add);
            std::hint::black_box(total)
        })
    });
    group.finish();
}

/// Runs `f` on a rayon worker, as the model's forward runs (a matmul called
/// from outside the pool waits for a worker to wake up every call).
fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let mut out = None;
    rayon::scope(|_| out = Some(f()));
    out.expect("the scope ran its closure")
}

/// Wall time of `iters` calls of `f`.
fn time(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = std::time::Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed()
}

/// A pool with `seqs` sequences of `CACHED` written positions each, and
/// their block tables (room for 64 more positions each).
fn filled_pool(seqs: usize, rng: &mut Rng) -> (KvPool, Vec<Vec<u32>>) {
    let per_seq = (CACHED + 64).div_ceil(BLOCK_SIZE);
    let mut pool = KvPool::new(1, KV_HEADS, HEAD_DIM, seqs * per_seq, DType::F16).unwrap();
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let ids = vec![0u32; CACHED];
    for table in &tables {
        let kv = rng.f32s(KV_HEADS * CACHED * HEAD_DIM);
        let q = rng.f32s(HEADS * CACHED * HEAD_DIM);
        let seq = [PagedSeq::new(&ids, 0, table)];
        paged_attention_step(&mut pool, 0, HEADS, &seq, &q, &kv, &kv);
    }
    (pool, tables)
}

fn bench_attention(c: &mut Criterion) {
    let mut rng = Rng(11);
    let mut group = c.benchmark_group("paged_attention/decode");
    configure(&mut group);
    for b in [1usize, 16, 64] {
        let (mut pool, tables) = filled_pool(b, &mut rng);
        let ids = [0u32];
        let seqs: Vec<PagedSeq<'_>> = tables
            .iter()
            .map(|t| PagedSeq::new(&ids, CACHED, t))
            .collect();
        let q = rng.f32s(HEADS * b * HEAD_DIM);
        let kv = rng.f32s(KV_HEADS * b * HEAD_DIM);
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("B{b}"), |bench| {
            bench.iter(|| paged_attention_step(&mut pool, 0, HEADS, &seqs, &q, &kv, &kv))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("paged_attention/prefill");
    configure(&mut group);
    let (mut pool, tables) = filled_pool(1, &mut rng);
    for rows in [16usize, 64] {
        let ids = vec![0u32; rows];
        let seqs = [PagedSeq::new(&ids, CACHED, &tables[0])];
        let q = rng.f32s(HEADS * rows * HEAD_DIM);
        let kv = rng.f32s(KV_HEADS * rows * HEAD_DIM);
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_function(format!("{rows}"), |bench| {
            bench.iter(|| paged_attention_step(&mut pool, 0, HEADS, &seqs, &q, &kv, &kv))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_matmul,
    bench_dense,
    bench_stream,
    bench_memory,
    bench_attention
);
criterion_main!(benches);
