//! The differentiable Llama forward with LoRA, over a [`Batch`] of padded
//! or packed rows.
//!
//! Every linear is `y = x W^T + scale * dropout(x) A^T B^T` with the frozen
//! `W` and, when an adapter is given, `A` `[r, in]` / `B` `[out, r]` (in the
//! base's layout: for a GGUF base the q/k `B` rows are GGUF-permuted).
//! Attention is causal inside each example (block-diagonal across packed
//! examples; padding attends only to padding), RoPE rotates each token at its
//! position inside its own example, and the output head runs only on the rows
//! whose next token carries loss.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};

use super::base::BaseWeights;
use super::ops::{rms_norm, rope, silu, softmax_last_dim};
use super::optim::Rng;

/// Rows of tokens laid out for one forward pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    pub rows: usize,
    pub len: usize,
    /// `rows * len` token ids (padding is token 0).
    pub tokens: Vec<u32>,
    /// Position of each token inside its example.
    pub positions: Vec<u32>,
    /// Example of each token (0 = padding); attention stays inside one.
    pub segments: Vec<u32>,
    /// Flat rows whose output predicts a loss token.
    pub loss_rows: Vec<u32>,
}

/// LoRA matrices applied in a forward: per layer, per target in
/// `LoraTarget::ALL` order, `(A, B)`.
pub(crate) struct LoraTensors {
    pub ab: Vec<[Option<(Tensor, Tensor)>; 7]>,
    pub scale: f64,
}

/// Dropout on LoRA inputs, seeded per (seed, step, layer, target).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dropout {
    pub p: f64,
    pub seed: u64,
    pub step: u64,
}

pub(crate) struct Forward<'a> {
    pub base: &'a BaseWeights,
    pub lora: Option<&'a LoraTensors>,
    pub dropout: Option<Dropout>,
}

/// `x W^T` for a frozen `W` (`[out, in]`, f32) with a backward pass for
/// `x` only: candle's own matmul backward would also compute (and allocate)
/// the gradient of `W`, a third of the work, which a frozen base never uses.
struct FrozenLinear(Tensor);

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (a, b) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("frozen linear: input not contiguous".into()))?;
        let x = Tensor::from_slice(&s.as_slice::<f32>()?[a..b], l.shape(), &Device::Cpu)?;
        let y = x.matmul(&self.0.t()?)?;
        let shape = y.shape().clone();
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1::<f32>()?), shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.0)?))
    }
}

/// `x W^T` (`x` `[n, in]`) without a gradient for `W`.
pub(crate) fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenLinear(w.clone()))
}

impl Forward<'_> {
    fn linear(&self, x: &Tensor, layer: usize, t: usize) -> Result<Tensor> {
        let w = &self.base.layers[layer].linears[t];
        let y = frozen_matmul(x, w)?;
        let Some(lora) = self.lora else {
            return Ok(y);
        };
        let Some((a, b)) = &lora.ab[layer][t] else {
            return Ok(y);
        };
        let xin = match self.dropout {
            Some(d) if d.p > 0.0 => {
                let mut rng = Rng::from_parts(&[d.seed, d.step, layer as u64, t as u64]);
                let keep = 1.0 - d.p;
                let mask: Vec<f32> = (0..x.elem_count())
                    .map(|_| {
                        if rng.next_f64() < keep {
                            (1.0 / keep) as f32
                        } else {
                            0.0
                        }
                    })
                    .collect();
                (x * Tensor::from_vec(mask, x.shape(), x.device())?)?
            }
            _ => x.clone(),
        };
        let z = xin.matmul(&a.t()?)?.matmul(&b.t()?)?;
        y + (z * lora.scale)?
    }

    /// Logits `[loss_rows, vocab]` of the batch's loss rows.
    pub fn logits(&self, batch: &Batch) -> Result<Tensor> {
        let base = self.base;
        let dm = &base.dims;
        let dev = base.embed.device();
        let (b, t) = (batch.rows, batch.len);
        let (nh, nkv, d) = (dm.heads, dm.kv_heads, dm.head_dim);
        let rep = nh / nkv;
        let ids = Tensor::new(batch.tokens.as_slice(), dev)?;
        let pos = Tensor::new(batch.positions.as_slice(), dev)?;
        let cos = base.cos.index_select(&pos, 0)?.reshape((b, 1, t, d / 2))?;
        let sin = base.sin.index_select(&pos, 0)?.reshape((b, 1, t, d / 2))?;
        let mut mask = vec![0f32; b * t * t];
        for r in 0..b {
            let seg = &batch.segments[r * t..(r + 1) * t];
            for i in 0..t {
                for j in 0..t {
                    if j > i || seg[i] != seg[j] {
                        mask[(r * t + i) * t + j] = -1e9;
                    }
                }
            }
        }
        let mask = Tensor::from_vec(mask, (b, 1, 1, t, t), dev)?;
        let mut x = base.embed.index_select(&ids, 0)?; // [b*t, h]
        for (l, lw) in base.layers.iter().enumerate() {
            let n = rms_norm(&x, &lw.attn_norm, base.eps)?;
            let heads = |y: Tensor, k: usize| y.reshape((b, t, k, d))?.transpose(1, 2);
            let q = heads(self.linear(&n, l, 0)?, nh)?;
            let k = heads(self.linear(&n, l, 1)?, nkv)?;
            let v = heads(self.linear(&n, l, 2)?, nkv)?.contiguous()?;
            let q = rope(&q.contiguous()?, &cos, &sin, base.layout)?;
            let k = rope(&k.contiguous()?, &cos, &sin, base.layout)?;
            // Query heads sharing a kv head are stacked as rows of one matmul.
            let q = q.reshape((b, nkv, rep * t, d))?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (d as f64).sqrt()))?;
            let scores = scores.reshape((b, nkv, rep, t, t))?.broadcast_add(&mask)?;
            let p = softmax_last_dim(&scores)?.reshape((b, nkv, rep * t, t))?;
            let y = p
                .matmul(&v)?
                .reshape((b, nh, t, d))?
                .transpose(1, 2)?
                .reshape((b * t, nh * d))?;
            x = (x + self.linear(&y, l, 3)?)?;
            let n = rms_norm(&x, &lw.ffn_norm, base.eps)?;
            let g = silu(&self.linear(&n, l, 4)?)?;
            let u = self.linear(&n, l, 5)?;
            x = (x + self.linear(&(g * u)?, l, 6)?)?;
        }
        let rows = Tensor::new(batch.loss_rows.as_slice(), dev)?;
        let h = rms_norm(&x.index_select(&rows, 0)?, &base.norm, base.eps)?;
        frozen_matmul(&h, &base.lm_head)
    }
}

/// One example's tokens and which of them carry loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedExample {
    pub tokens: Vec<u32>,
    /// `loss[i]`: the model is trained to predict `tokens[i]` (from
    /// `tokens[..i]`); `loss[0]` is never used.
    pub loss: Vec<bool>,
}

impl TokenizedExample {
    /// Tokens that carry loss (excluding position 0, which has no context).
    pub fn loss_tokens(&self) -> usize {
        self.loss.iter().skip(1).filter(|&&m| m).count()
    }
}

/// Lays out `examples` for the reference forward, with the targets of the
/// loss rows: without packing one example per row, padded to the
/// longest; with packing, consecutive examples share a row while they fit in
/// `context` tokens (then rows are padded to the longest row).
#[cfg(test)]
pub(crate) fn build_batch(
    examples: &[&TokenizedExample],
    packing: bool,
    context: usize,
) -> (Batch, Vec<u32>) {
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut row_len = 0;
    for (i, e) in examples.iter().enumerate() {
        let n = e.tokens.len();
        if !packing || rows.is_empty() || row_len + n > context {
            rows.push(vec![i]);
            row_len = n;
        } else {
            rows.last_mut().expect("a row").push(i);
            row_len += n;
        }
    }
    let len = rows
        .iter()
        .map(|r| r.iter().map(|&i| examples[i].tokens.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut b = Batch {
        rows: rows.len(),
        len,
        tokens: vec![0; rows.len() * len],
        positions: vec![0; rows.len() * len],
        segments: vec![0; rows.len() * len],
        ..Default::default()
    };
    let mut targets = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let mut off = r * len;
        for &i in row {
            let e = examples[i];
            for (p, &tok) in e.tokens.iter().enumerate() {
                b.tokens[off + p] = tok;
                b.positions[off + p] = p as u32;
                b.segments[off + p] = i as u32 + 1;
                if p > 0 && e.loss[p] {
                    b.loss_rows.push((off + p - 1) as u32);
                    targets.push(tok);
                }
            }
            off += e.tokens.len();
        }
    }
    (b, targets)
}
