//! Applying LoRA adapters per sequence inside one flattened batch.
//!
//! The base projections run once over every row of the batch; then, for each
//! distinct adapter in the batch (sequences sharing an adapter form one
//! group), the rows of its sequences get `scale * (x A^T) B^T` added. Rows of
//! sequences without an adapter are untouched, so a batch without adapters
//! costs nothing extra.
//!
//! [`LoraSpec`] is what an adapter is checked against before it is used:
//! the model's shapes, and whether the base stores its q/k rows in GGUF's
//! permuted order (then the adapter's q/k `B` rows are permuted to match).

use candle_core::{CpuStorage, DType, Device, Result, Storage, Tensor};

use crate::lora::{LoraAdapter, LoraTarget};
use crate::{ModelInfo, PagedSeq};

/// The shapes and layout an adapter must fit to run on a model.
#[derive(Debug, Clone)]
pub struct LoraSpec {
    pub info: ModelInfo,
    pub intermediate_size: usize,
    /// The base stores q/k rows permuted for interleaved RoPE (GGUF).
    pub gguf_layout: bool,
    pub device: Device,
}

impl LoraSpec {
    /// Checks a Hugging Face layout adapter against the model and returns it
    /// ready for [`crate::CausalLM::forward_paged`]: q/k rows permuted for a
    /// GGUF base, tensors on the model's device.
    pub fn prepare(&self, adapter: &LoraAdapter) -> Result<LoraAdapter> {
        adapter.check_shapes(&self.info, self.intermediate_size)?;
        let mut out = if self.gguf_layout {
            let i = &self.info;
            adapter.permuted_for_gguf(i.num_heads, i.num_kv_heads, i.head_dim, true)?
        } else {
            adapter.clone()
        };
        for layer in out.layers.iter_mut() {
            for w in layer.values_mut() {
                w.a = w.a.to_device(&self.device)?.contiguous()?;
                w.b = w.b.to_device(&self.device)?.contiguous()?;
                w.bt = match self.device {
                    Device::Cpu => Some(w.b.to_dtype(DType::F32)?.t()?.contiguous()?),
                    _ => None,
                };
            }
        }
        Ok(out)
    }
}

/// Sequences of one batch that share an adapter: their flattened rows.
struct Group<'a> {
    adapter: &'a LoraAdapter,
    scale: f64,
    /// Row indices into the flattened batch.
    rows: Tensor,
    /// The same, for the slice path.
    row_ids: Vec<usize>,
    /// `Some((start, len))` when the rows are one contiguous range.
    range: Option<(usize, usize)>,
    /// For every row of the batch, its row in the group's delta padded with
    /// one zero row (index `rows.len()` for rows outside the group): the
    /// delta is spread over the batch with one `index_select` (much faster
    /// than candle's `index_add` on the CPU).
    spread: Tensor,
}

/// The adapter groups of one batch.
pub(crate) struct LoraBatch<'a> {
    groups: Vec<Group<'a>>,
}

impl<'a> LoraBatch<'a> {
    /// Groups `seqs` by adapter (by identity); `offsets[i]` is the first
    /// flattened row of sequence `i`.
    pub(crate) fn new(seqs: &[PagedSeq<'a>], offsets: &[usize], device: &Device) -> Result<Self> {
        let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut grouped: Vec<(&'a LoraAdapter, Vec<(usize, usize)>)> = Vec::new();
        for (s, &off) in seqs.iter().zip(offsets) {
            let Some(adapter) = s.lora else { continue };
            let span = (off, s.tokens.len());
            match grouped.iter_mut().find(|(a, _)| std::ptr::eq(*a, adapter)) {
                Some((_, spans)) => spans.push(span),
                None => grouped.push((adapter, vec![span])),
            }
        }
        let mut groups = Vec::with_capacity(grouped.len());
        for (adapter, spans) in grouped {
            let rows: Vec<u32> = spans
                .iter()
                .flat_map(|&(o, n)| (o..o + n).map(|r| r as u32))
                .collect();
            let contiguous = spans.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
            let range = contiguous.then(|| (spans[0].0, rows.len()));
            let mut spread = vec![rows.len() as u32; total];
            for (i, &r) in rows.iter().enumerate() {
                spread[r as usize] = i as u32;
            }
            groups.push(Group {
                adapter,
                scale: adapter.config.scale(),
                rows: Tensor::new(rows.as_slice(), device)?,
                row_ids: rows.iter().map(|&r| r as usize).collect(),
                range,
                spread: Tensor::new(spread.as_slice(), device)?,
            });
        }
        Ok(Self { groups })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// [`LoraBatch::apply`] on CPU slices, one row at a time: `x` is
    /// `[tokens, in]` and `y` `[tokens, out]`, to which each group's rows get
    /// `scale * B (A x)`. A row's delta is then the same whatever else is in
    /// the batch, where a matrix product's summation order (candle's) changes
    /// with its row count, so a sequence recomputed in one chunk after
    /// preemption would drift from the one-token steps it first ran as.
    pub(crate) fn apply_rows(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<()> {
        for g in &self.groups {
            let Some(w) = g.adapter.layers.get(layer).and_then(|l| l.get(&target)) else {
                continue;
            };
            let (rank, k) = w.a.dims2()?;
            let n = w.b.dim(0)?;
            let scale = g.scale as f32;
            let bt = match &w.bt {
                Some(bt) => bt.clone(),
                None => w.b.t()?.contiguous()?,
            };
            with_f32(&w.a, |a| {
                with_f32(&bt, |bt| {
                    let s = LowRank {
                        k,
                        n,
                        rank,
                        scale,
                        x,
                        a,
                        bt,
                    };
                    low_rank_rows(&s, &g.row_ids, y)
                })?
            })??;
        }
        Ok(())
    }

    /// `y` (the base projection of `x`, both flattened over the batch) plus
    /// each group's low-rank delta on its rows.
    pub(crate) fn apply(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &Tensor,
        mut y: Tensor,
    ) -> Result<Tensor> {
        for g in &self.groups {
            let Some(w) = g.adapter.layers.get(layer).and_then(|l| l.get(&target)) else {
                continue;
            };
            let xs = match g.range {
                Some((start, len)) => x.narrow(0, start, len)?,
                None => x.index_select(&g.rows, 0)?,
            };
            let delta = (xs.matmul(&w.a.t()?)?.matmul(&w.b.t()?)? * g.scale)?;
            y = match g.range {
                Some((0, len)) if len == y.dim(0)? => (y + delta)?,
                _ => {
                    let zero = Tensor::zeros((1, delta.dim(1)?), delta.dtype(), delta.device())?;
                    let padded = Tensor::cat(&[&delta, &zero], 0)?;
                    (y + padded.index_select(&g.spread, 0)?)?
                }
            };
        }
        Ok(y)
    }
}

/// `f` over a tensor's values as f32, row major: borrowed from a contiguous
/// f32 CPU tensor (a prepared adapter's), else converted.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[start..end]));
        }
    }
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(f(&v))
}

/// One adapted projection's inputs: `A` (`a`, `[rank, k]`), `B`
/// transposed (`bt`, `[rank, n]`), the scale, and the batch's input rows
/// `x` (rows of `k`).
struct LowRank<'a> {
    k: usize,
    n: usize,
    rank: usize,
    scale: f32,
    x: &'a [f32],
    a: &'a [f32],
    bt: &'a [f32],
}

/// `y_r += B (scale A x_r)` for each row `r` of `rows` (`x` rows of `k`,
/// `y` rows of `n`; `bt` is `B` transposed, `[rank, n]`). The `A` products
/// are 16-way split dot products; the `B` product adds `h_j` times row `j`
/// of `B^T` to `y_r` for each `j` (contiguous, so it vectorises, where a
/// dot product of `rank` terms per output is a chain of dependent adds).
/// Compiled for AVX2 + FMA where the CPU has them. A row's result depends
/// only on that row, never on the rest of the batch.
fn low_rank_rows(s: &LowRank, rows: &[usize], y: &mut [f32]) -> Result<()> {
    let (k, n, rank) = (s.k, s.n, s.rank);
    let fits = s.a.len() >= rank * k
        && s.bt.len() >= n * rank
        && rows
            .iter()
            .all(|&r| (r + 1) * k <= s.x.len() && (r + 1) * n <= y.len());
    if !fits {
        candle_core::bail!("LoRA delta: the rows do not fit the adapter's shapes");
    }
    split_rows(s, rows, y, 0);
    Ok(())
}

/// Rows from which a call's rows are shared between two threads (below,
/// a thread's start costs more than it saves).
const PARALLEL_ROWS: usize = 8;

/// [`low_rank_rows`] on `y` from batch row `first` on: halves of many
/// ascending rows in parallel (each row's work is the same either way).
fn split_rows(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    if rows.len() >= PARALLEL_ROWS && rows.windows(2).all(|w| w[0] < w[1]) {
        let mid = rows.len() / 2;
        let (low, high) = y.split_at_mut((rows[mid] - first) * s.n);
        rayon::join(
            || split_rows(s, &rows[..mid], low, first),
            || split_rows(s, &rows[mid..], high, rows[mid]),
        );
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::vecmath::has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
            low_rank_body::<true>(s, rows, y, first)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        unsafe { fast(s, rows, y, first) };
        return;
    }
    low_rank_body::<false>(s, rows, y, first);
}

/// [`low_rank_rows`]' loops, fused multiply-adds when `FMA`; `y` starts
/// at batch row `first`.
#[inline(always)]
fn low_rank_body<const FMA: bool>(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    use crate::vecmath::{dot16, madd};
    let (k, n, rank, x, a, bt) = (s.k, s.n, s.rank, s.x, s.a, s.bt);
    let mut h = vec![0f32; rank];
    for &r in rows {
        let xr = &x[r * k..(r + 1) * k];
        for (j, h) in h.iter_mut().enumerate() {
            *h = s.scale * dot16::<FMA>(xr, &a[j * k..(j + 1) * k]);
        }
        let yr = &mut y[(r - first) * n..(r - first + 1) * n];
        for (j, &hj) in h.iter().enumerate() {
            for (y, &b) in yr.iter_mut().zip(&bt[j * n..(j + 1) * n]) {
                *y = madd::<FMA>(b, hj, *y);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel, with and without FMA (the first where the CPU has it),
    /// against an f64 sum.
    #[test]
    fn low_rank_rows_match_a_plain_sum() {
        for (k, n, rank) in [(576, 576, 8), (576, 192, 16), (1536, 576, 8), (37, 21, 3)] {
            let val = |i: usize| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.1;
            let x: Vec<f32> = (0..4 * k).map(|i| val(i + 1)).collect();
            let a: Vec<f32> = (0..rank * k).map(|i| val(i + 7)).collect();
            let b: Vec<f32> = (0..n * rank).map(|i| val(i + 13)).collect();
            let bt: Vec<f32> = (0..rank * n).map(|i| b[(i % n) * rank + i / n]).collect();
            let rows = [0usize, 2, 3];
            let shape = LowRank {
                k,
                n,
                rank,
                scale: 2.0,
                x: &x,
                a: &a,
                bt: &bt,
            };
            let want = |r: usize, o: usize| -> f64 {
                (0..rank)
                    .map(|j| {
                        let h: f64 = (0..k)
                            .map(|i| x[r * k + i] as f64 * a[j * k + i] as f64)
                            .sum();
                        b[o * rank + j] as f64 * 2.0 * h
                    })
                    .sum()
            };
            let mut y = vec![1f32; 4 * n];
            low_rank_rows(&shape, &rows, &mut y).unwrap();
            let mut plain = vec![1f32; 4 * n];
            low_rank_body::<false>(&shape, &rows, &mut plain, 0);
            for r in 0..4 {
                for o in 0..n {
                    let expect = if rows.contains(&r) {
                        1.0 + want(r, o)
                    } else {
                        1.0
                    };
                    for got in [y[r * n + o], plain[r * n + o]] {
                        assert!(
                            (got as f64 - expect).abs() < 1e-5,
                            "{k}x{n} r{rank}: {got} vs {expect}"
                        );
                    }
                }
            }
            // Many rows: shared between threads, each row as alone.
            let many: Vec<usize> = (0..4).chain(0..4).chain(0..4).collect::<Vec<_>>();
            let mut xs = Vec::new();
            for &r in &many {
                xs.extend_from_slice(&x[r * k..(r + 1) * k]);
            }
            let all: Vec<usize> = (0..many.len()).collect();
            let mut wide = vec![1f32; many.len() * n];
            let wide_shape = LowRank { x: &xs, ..shape };
            low_rank_rows(&wide_shape, &all, &mut wide).unwrap();
            for (i, &r) in many.iter().enumerate() {
                if rows.contains(&r) {
                    assert_eq!(&wide[i * n..(i + 1) * n], &y[r * n..(r + 1) * n]);
                }
            }
            let mut short = vec![0f32; n];
            assert!(low_rank_rows(&shape, &[1], &mut short).is_err());
        }
    }
}
