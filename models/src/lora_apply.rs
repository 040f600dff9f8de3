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

use std::sync::Arc;

use crate::lora::{LoraAdapter, LoraTarget, RowWeights};
use crate::lora_rows::{low_rank_rows, LowRank, PARALLEL_ROWS};
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
                w.rows = match self.device {
                    Device::Cpu => Some(Arc::new(RowWeights::new(&w.a, &w.b)?)),
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
    /// Rows of the batch that have an adapter (every group's).
    rows: usize,
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
        let rows = groups.iter().map(|g| g.row_ids.len()).sum();
        Ok(Self { groups, rows })
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
        self.apply_rows_on(layer, target, x, y, true)
    }

    /// [`LoraBatch::apply_rows`] for several projections of one input (q,
    /// k and v; gate and up). With fewer rows than [`PARALLEL_ROWS`] (a
    /// decode step of a few streams), the first half of `outs` runs on one
    /// thread and the rest on the other: one hand-off for the lot, where
    /// each projection alone is too small to pay for one. Each output gets
    /// the same bits as from [`LoraBatch::apply_rows`].
    pub(crate) fn apply_rows_shared(
        &self,
        layer: usize,
        x: &[f32],
        outs: &mut [(LoraTarget, &mut [f32])],
    ) -> Result<()> {
        if outs.len() >= 2 && self.rows < PARALLEL_ROWS && rayon::current_num_threads() > 1 {
            let (first, rest) = outs.split_at_mut(outs.len() / 2);
            let each = |outs: &mut [(LoraTarget, &mut [f32])]| -> Result<()> {
                for (target, y) in outs.iter_mut() {
                    self.apply_rows_on(layer, *target, x, y, false)?;
                }
                Ok(())
            };
            let (a, b) = rayon::join(|| each(first), || each(rest));
            return a.and(b);
        }
        for (target, y) in outs.iter_mut() {
            self.apply_rows_on(layer, *target, x, y, true)?;
        }
        Ok(())
    }

    /// [`LoraBatch::apply_rows`], on this thread alone unless `parallel`.
    fn apply_rows_on(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &[f32],
        y: &mut [f32],
        parallel: bool,
    ) -> Result<()> {
        for g in &self.groups {
            let Some(w) = g.adapter.layers.get(layer).and_then(|l| l.get(&target)) else {
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
                a: &weights.a,
                bt: &weights.bt,
            };
            low_rank_rows(&s, &g.row_ids, y, parallel)?;
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
