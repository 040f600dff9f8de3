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

use candle_core::{Device, Result, Tensor};
use hearth_kernels::QuantMatrix;

use std::sync::{Arc, Mutex};

use crate::lora::{LoraAdapter, LoraTarget, LoraWeights, RowWeights};
use crate::lora_rows::{add_low_rank_rows, low_rank_rows, LowRank};
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
        let mut rows = Vec::new();
        for layer in out.layers.iter_mut() {
            for w in layer.values_mut() {
                w.a = w.a.to_device(&self.device)?.contiguous()?;
                w.b = w.b.to_device(&self.device)?.contiguous()?;
                if matches!(self.device, Device::Cpu) {
                    rows.push(RowWeights::new(&w.a, &w.b)?);
                }
            }
        }
        // In the order a step reads them: layer by layer, each layer's
        // targets in order (q, k, v, o, gate, up, down).
        RowWeights::pack(rows.iter_mut());
        let mut rows = rows.into_iter();
        for w in out.layers.iter_mut().flat_map(|l| l.values_mut()) {
            w.rows = rows.next().map(Arc::new);
        }
        // Uploaded by this (loader) thread, used by the engine's.
        crate::settle(&self.device)?;
        Ok(out)
    }
}

/// Rows of a step from which [`LoraBatch::project`] adds the deltas after
/// the base products, straight onto them, instead of into scratch beside
/// them (a prompt's many rows of low-rank work are better spent on both
/// threads after the base; a decode step's few rows fill the base
/// products' idle time).
const DIRECT_ROWS: usize = 32;

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

impl Group<'_> {
    /// The group's adapter on `target` of `layer`, if it adapts it.
    fn weights(&self, layer: usize, target: LoraTarget) -> Option<&LoraWeights> {
        self.adapter.layers.get(layer).and_then(|l| l.get(&target))
    }
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

    /// `out_i = x W_i^T` plus each group's `scale * B (A x)` on its rows,
    /// for projections of one input (q, k and v; gate and up; or one), on
    /// CPU slices: `x` is `[tokens, in]`, each `out_i` `[tokens, n_i]`.
    ///
    /// Below [`DIRECT_ROWS`] rows the deltas are computed one row at a
    /// time, into `deltas` (scratch) from zero, while the base matrices
    /// run, then added to their rows. Where every group has one row (one
    /// stream, or one row per adapter), one task per projection in the
    /// same parallel loop as the base matrices' chunks
    /// ([`QuantMatrix::matmul_many_beside`]: the pool's threads share the
    /// low-rank tasks and the chunks); else all of them on one branch of a
    /// `rayon::join` beside the base products (the kernels of several rows
    /// split their own work between threads, and as tasks of the loop they
    /// were 2-4% slower at eight streams on one adapter). A row's delta is
    /// the same whatever else is in the batch, where a matrix product's
    /// summation order (candle's) changes with its row count, so a
    /// sequence recomputed in one chunk after preemption would not drift
    /// from the one-token steps it first ran as.
    pub(crate) fn project(
        &self,
        layer: usize,
        x: &[f32],
        tokens: usize,
        outs: &mut [(&QuantMatrix, LoraTarget, &mut [f32])],
        deltas: &mut Vec<f32>,
    ) -> Result<()> {
        let targets: Vec<LoraTarget> = outs.iter().map(|(_, t, _)| *t).collect();
        let mut mats: Vec<(&QuantMatrix, &mut [f32])> =
            outs.iter_mut().map(|(w, _, y)| (*w, &mut **y)).collect();
        if self.is_empty() {
            QuantMatrix::matmul_many(&mut mats, x, tokens);
            return Ok(());
        }
        if tokens >= DIRECT_ROWS {
            QuantMatrix::matmul_many(&mut mats, x, tokens);
            for ((_, y), &target) in mats.iter_mut().zip(&targets) {
                self.add_rows_on(layer, target, x, y, deltas)?;
            }
            return Ok(());
        }
        let lens: Vec<usize> = mats.iter().map(|(_, y)| y.len()).collect();
        deltas.clear();
        deltas.resize(lens.iter().sum(), 0.0);
        let mut parts = Vec::with_capacity(lens.len());
        let mut rest = deltas.as_mut_slice();
        for &len in &lens {
            let (part, tail) = rest.split_at_mut(len);
            parts.push(Mutex::new(part));
            rest = tail;
        }
        let failed = Mutex::new(None);
        let delta = |i: usize| {
            let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = self.apply_rows_on(layer, targets[i], x, &mut part) {
                *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            }
        };
        if self.groups.iter().all(|g| g.row_ids.len() == 1) {
            QuantMatrix::matmul_many_beside(&mut mats, x, tokens, targets.len(), &delta);
        } else {
            rayon::join(
                || QuantMatrix::matmul_many(&mut mats, x, tokens),
                || (0..targets.len()).for_each(delta),
            );
        }
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        let mut delta = deltas.as_slice();
        for (((_, y), &target), &len) in mats.iter_mut().zip(&targets).zip(&lens) {
            let (part, tail) = delta.split_at(len);
            delta = tail;
            let n = len / tokens.max(1);
            for g in self
                .groups
                .iter()
                .filter(|g| g.weights(layer, target).is_some())
            {
                for &r in &g.row_ids {
                    let rows = r * n..(r + 1) * n;
                    for (y, d) in y[rows.clone()].iter_mut().zip(&part[rows]) {
                        *y += d;
                    }
                }
            }
        }
        Ok(())
    }

    /// `each(group, its low-rank shapes and weights)` for the groups whose
    /// adapter has `target` in `layer`.
    fn each_low_rank(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &[f32],
        mut each: impl FnMut(&Group<'_>, &LowRank) -> Result<()>,
    ) -> Result<()> {
        for g in &self.groups {
            let Some(w) = g.weights(layer, target) else {
                continue;
            };
            let (rank, k) = w.a.dims2()?;
            let n = w.b.dim(0)?;
            let made;
            let weights = match &w.rows {
                Some(r) => r.as_ref(),
                None => {
                    made = RowWeights::new(&w.a, &w.b)?;
                    &made
                }
            };
            let s = LowRank {
                k,
                n,
                rank,
                scale: g.scale as f32,
                x,
                a: weights.a(),
                bt: weights.bt(),
            };
            each(g, &s)?;
        }
        Ok(())
    }

    /// Each group's `scale * B (A x)` into its rows of `y` (zeroed).
    fn apply_rows_on(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<()> {
        self.each_low_rank(layer, target, x, |g, s| low_rank_rows(s, &g.row_ids, y))
    }

    /// Each group's `scale * B (A x)` added to its rows of `y` (the base
    /// products), the same bits as [`Self::apply_rows_on`] into zeroed
    /// scratch added after: straight onto `y` where the CPU can, else
    /// through `scratch`.
    fn add_rows_on(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        self.each_low_rank(layer, target, x, |g, s| {
            if add_low_rank_rows(s, &g.row_ids, y)? {
                return Ok(());
            }
            scratch.clear();
            scratch.resize(y.len(), 0.0);
            low_rank_rows(s, &g.row_ids, scratch)?;
            let n = s.n;
            for &r in &g.row_ids {
                let rows = r * n..(r + 1) * n;
                for (y, d) in y[rows.clone()].iter_mut().zip(&scratch[rows]) {
                    *y += d;
                }
            }
            Ok(())
        })
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
            let Some(w) = g.weights(layer, target) else {
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
