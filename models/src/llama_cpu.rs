//! The Llama blocks on plain f32 slices, for CPU models whose linear layers
//! are all `hearth-kernels` matrices (the GGUF 32-value formats, no bias).
//!
//! The same arithmetic as the candle path of `llama.rs` (RMSNorm, RoPE at
//! each token's position, paged attention, SwiGLU, residual adds) without
//! its per-operation costs: at one token per step a layer is about twenty
//! candle operations of a few hundred values each, and their allocations,
//! dispatch and thread hand-offs took as long as the matrix products. Here
//! each layer quantizes its normed input once for Q/K/V and once for
//! gate/up (`QuantMatrix::matmul_many`), rotates queries and keys straight
//! into the head-major layout attention reads, and adds residuals in place.
//! Element-wise work runs on the rayon pool only when a step has enough rows
//! (prefill) to pay for it.
//!
//! LoRA adapters add their low-rank deltas to the projections' outputs on
//! their own sequences' rows, one row at a time, computed while the base
//! products run (`LoraBatch::project`): every row, with or without an
//! adapter, comes out the same whatever else is in the batch (with Q4_K,
//! Q5_K and Q6_K weights on CPUs with AVX-512 VNNI, the same among steps of up
//! to four rows and among larger steps: the two take different activation
//! scales, `hearth_kernels::Format::activation_span`).

use std::sync::Arc;

use candle_core::Result;
use hearth_kernels::QuantMatrix;
use rayon::prelude::*;

use crate::linear::Linear;
use crate::llama_layers::{Block, RmsNorm};
use crate::lora::LoraTarget;
use crate::lora_apply::LoraBatch;
use crate::paged::{paged_attention, AttnShape, KvPool, SeqView};
use crate::rotary::{RopeLayout, Rotary};
use crate::vecmath;

/// Rows from which element-wise work is split across the pool.
const PARALLEL_ROWS: usize = 16;

/// Tokens from which a step's RoPE, head copies and residual adds are
/// split across the pool (prompt chunks): below it (decode of up to 63
/// sequences) they stay on the calling thread, as before the split, where
/// a fork and join costs about what the split saves.
const SPLIT_TOKENS: usize = 64;

/// One block's weights as slices and kernel matrices.
struct Layer {
    attn_norm: Norm,
    ffn_norm: Norm,
    q: Arc<QuantMatrix>,
    k: Arc<QuantMatrix>,
    v: Arc<QuantMatrix>,
    o: Arc<QuantMatrix>,
    gate: Arc<QuantMatrix>,
    up: Arc<QuantMatrix>,
    down: Arc<QuantMatrix>,
}

struct Norm {
    weight: Vec<f32>,
    eps: f32,
}

impl Norm {
    fn new(n: &RmsNorm) -> Result<Self> {
        Ok(Self {
            weight: n.weight_f32()?,
            eps: n.eps(),
        })
    }

    /// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for each row.
    fn apply(&self, x: &[f32], out: &mut [f32]) {
        let h = self.weight.len();
        let row = |(x, out): (&[f32], &mut [f32])| {
            let ms = x.iter().map(|v| v * v).sum::<f32>() / h as f32;
            let scale = 1.0 / (ms + self.eps).sqrt();
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(&self.weight) {
                *o = v * scale * w;
            }
        };
        if x.len() / h >= PARALLEL_ROWS {
            x.par_chunks(h).zip(out.par_chunks_mut(h)).for_each(row);
        } else {
            x.chunks(h).zip(out.chunks_mut(h)).for_each(row);
        }
    }
}

/// The model's blocks prepared for [`CpuBlocks::run`].
pub(crate) struct CpuBlocks {
    layers: Vec<Layer>,
    /// `[positions, head_dim / 2]`.
    cos: Vec<f32>,
    sin: Vec<f32>,
    layout: RopeLayout,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// The shapes and scratch buffers of one forward.
struct Scratch {
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q_heads: Vec<f32>,
    k_heads: Vec<f32>,
    v_heads: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// LoRA deltas of the projections being computed.
    deltas: Vec<f32>,
}

impl CpuBlocks {
    /// `Some` when every linear layer of every block is a kernel matrix
    /// without bias.
    pub(crate) fn new(
        blocks: &[Block],
        rotary: &Rotary,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Option<Self>> {
        let kernel = |l: &Linear| l.kernel().cloned();
        let mut layers = Vec::with_capacity(blocks.len());
        for b in blocks {
            let (a, m) = (&b.attn, &b.mlp);
            let (Some(q), Some(k), Some(v), Some(o), Some(gate), Some(up), Some(down)) = (
                kernel(&a.q),
                kernel(&a.k),
                kernel(&a.v),
                kernel(&a.o),
                kernel(&m.gate),
                kernel(&m.up),
                kernel(&m.down),
            ) else {
                return Ok(None);
            };
            layers.push(Layer {
                attn_norm: Norm::new(&b.attn_norm)?,
                ffn_norm: Norm::new(&b.ffn_norm)?,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
            });
        }
        let (cos, sin) = rotary.tables()?;
        Ok(Some(Self {
            layers,
            cos,
            sin,
            layout: rotary.layout(),
            num_heads,
            num_kv_heads,
            head_dim,
        }))
    }

    /// Runs every block over `x` (`[tokens, hidden]`, the flattened new
    /// tokens of `seqs`, token `t` at position `positions[t]`), in place.
    pub(crate) fn run(
        &self,
        x: &mut [f32],
        positions: &[u32],
        seqs: &[SeqView<'_>],
        pool: &mut KvPool,
        lora: &LoraBatch<'_>,
    ) -> Result<()> {
        let t = positions.len();
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let Some(first) = self.layers.first() else {
            return Ok(());
        };
        let ff = first.gate.n();
        let mut s = Scratch {
            normed: vec![0.0; x.len()],
            q: vec![0.0; t * nh * d],
            k: vec![0.0; t * nkv * d],
            v: vec![0.0; t * nkv * d],
            q_heads: vec![0.0; t * nh * d],
            k_heads: vec![0.0; t * nkv * d],
            v_heads: vec![0.0; t * nkv * d],
            proj: vec![0.0; x.len()],
            gate: vec![0.0; t * ff],
            up: vec![0.0; t * ff],
            deltas: Vec::new(),
        };
        for (i, layer) in self.layers.iter().enumerate() {
            layer.attn_norm.apply(x, &mut s.normed);
            lora.project(
                i,
                &s.normed,
                t,
                &mut [
                    (&layer.q, LoraTarget::Q, &mut s.q),
                    (&layer.k, LoraTarget::K, &mut s.k),
                    (&layer.v, LoraTarget::V, &mut s.v),
                ],
                &mut s.deltas,
            )?;
            self.rope_heads(&s.q, nh, positions, &mut s.q_heads);
            self.rope_heads(&s.k, nkv, positions, &mut s.k_heads);
            to_heads(&s.v, nkv, d, &mut s.v_heads);
            for seq in seqs {
                pool.write(i, seq, &s.k_heads, &s.v_heads, t);
            }
            let shape = AttnShape {
                num_heads: nh,
                tokens: t,
            };
            let y = paged_attention(pool, i, &s.q_heads, shape, seqs);
            let o = &mut [(&*layer.o, LoraTarget::O, &mut s.proj[..])];
            lora.project(i, &y, t, o, &mut s.deltas)?;
            add_into(x, &s.proj, t);

            layer.ffn_norm.apply(x, &mut s.normed);
            lora.project(
                i,
                &s.normed,
                t,
                &mut [
                    (&layer.gate, LoraTarget::Gate, &mut s.gate),
                    (&layer.up, LoraTarget::Up, &mut s.up),
                ],
                &mut s.deltas,
            )?;
            silu_mul(&mut s.gate, &s.up, ff);
            let down = &mut [(&*layer.down, LoraTarget::Down, &mut s.proj[..])];
            lora.project(i, &s.gate, t, down, &mut s.deltas)?;
            add_into(x, &s.proj, t);
        }
        Ok(())
    }

    /// `y` (`[tokens, heads * d]`) rotated at each token's position into
    /// `out` (`[heads, tokens, d]`).
    fn rope_heads(&self, y: &[f32], heads: usize, positions: &[u32], out: &mut [f32]) {
        let (d, t) = (self.head_dim, positions.len());
        let half = d / 2;
        let head = |(h, out): (usize, &mut [f32])| {
            for (i, &p) in positions.iter().enumerate() {
                let src = &y[(i * heads + h) * d..][..d];
                let dst = &mut out[i * d..][..d];
                let (cos, sin) = (
                    &self.cos[p as usize * half..][..half],
                    &self.sin[p as usize * half..][..half],
                );
                match self.layout {
                    // Iterators, not indices: without bounds checks the
                    // loops are vectorised.
                    RopeLayout::Halves => {
                        let (x0, x1) = src.split_at(half);
                        let (d0, d1) = dst.split_at_mut(half);
                        let pairs = x0.iter().zip(x1).zip(cos.iter().zip(sin));
                        for ((d0, d1), ((&a, &b), (&c, &s))) in d0.iter_mut().zip(d1).zip(pairs) {
                            *d0 = a * c - b * s;
                            *d1 = a * s + b * c;
                        }
                    }
                    RopeLayout::Interleaved => {
                        let pairs = src.chunks_exact(2).zip(cos.iter().zip(sin));
                        for (d, (x, (&c, &s))) in dst.chunks_exact_mut(2).zip(pairs) {
                            d[0] = x[0] * c - x[1] * s;
                            d[1] = x[0] * s + x[1] * c;
                        }
                    }
                }
            }
        };
        per_head(&mut out[..heads * t * d], t, d, head);
    }
}

/// `f` on each head's part of `out` (`[heads, tokens, d]`) with its index,
/// the heads split across the pool from [`SPLIT_TOKENS`] tokens on.
fn per_head(
    out: &mut [f32],
    tokens: usize,
    d: usize,
    f: impl Fn((usize, &mut [f32])) + Sync + Send,
) {
    let per = tokens * d;
    if per == 0 {
        return;
    }
    if tokens >= SPLIT_TOKENS {
        out.par_chunks_mut(per).enumerate().for_each(f);
    } else {
        out.chunks_mut(per).enumerate().for_each(f);
    }
}

/// `[tokens, heads * d]` to `[heads, tokens, d]`.
fn to_heads(y: &[f32], heads: usize, d: usize, out: &mut [f32]) {
    let t = y.len() / (heads * d);
    per_head(&mut out[..heads * t * d], t, d, |(h, out)| {
        for i in 0..t {
            out[i * d..][..d].copy_from_slice(&y[(i * heads + h) * d..][..d]);
        }
    });
}

/// `x += y` for a step of `tokens` rows, in parts across the pool from
/// [`SPLIT_TOKENS`] on.
fn add_into(x: &mut [f32], y: &[f32], tokens: usize) {
    const PART: usize = 1 << 14;
    let add = |(x, y): (&mut [f32], &[f32])| {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    };
    if tokens >= SPLIT_TOKENS {
        x.par_chunks_mut(PART).zip(y.par_chunks(PART)).for_each(add);
    } else {
        add((x, y));
    }
}

/// `g = silu(g) * u`, rows of `width` split across the pool when many.
fn silu_mul(g: &mut [f32], u: &[f32], width: usize) {
    let row = |(g, u): (&mut [f32], &[f32])| vecmath::silu_mul_inplace(g, u);
    if g.len() / width >= PARALLEL_ROWS {
        g.par_chunks_mut(width)
            .zip(u.par_chunks(width))
            .for_each(row);
    } else {
        g.chunks_mut(width).zip(u.chunks(width)).for_each(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each token's heads rotated at its position into the head-major
    /// layout, in both layouts: `(i, i + d/2)` pairs and `(2i, 2i + 1)`
    /// pairs, on one thread (few tokens) and across the pool (many).
    #[test]
    fn rope_heads_rotates_each_pair_at_its_position() {
        let (heads, d, half) = (3, 8, 4);
        for tokens in [3usize, SPLIT_TOKENS] {
            let positions: Vec<u32> = (0..tokens as u32).map(|i| (i * 7) % 40).collect();
            let angle = |p: u32, j: usize| p as f32 * 0.5f32.powi(j as i32);
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for p in 0..40 {
                for j in 0..half {
                    cos.push(angle(p, j).cos());
                    sin.push(angle(p, j).sin());
                }
            }
            let y: Vec<f32> = (0..tokens * heads * d)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            for layout in [RopeLayout::Halves, RopeLayout::Interleaved] {
                let blocks = CpuBlocks {
                    layers: Vec::new(),
                    cos: cos.clone(),
                    sin: sin.clone(),
                    layout,
                    num_heads: heads,
                    num_kv_heads: heads,
                    head_dim: d,
                };
                let mut out = vec![0f32; y.len()];
                blocks.rope_heads(&y, heads, &positions, &mut out);
                for (i, &p) in positions.iter().enumerate() {
                    for h in 0..heads {
                        let x = &y[(i * heads + h) * d..][..d];
                        let o = &out[(h * tokens + i) * d..][..d];
                        for j in 0..half {
                            let (c, s) = (angle(p, j).cos(), angle(p, j).sin());
                            let (a, b) = match layout {
                                RopeLayout::Halves => (j, j + half),
                                RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                            };
                            assert_eq!(o[a], x[a] * c - x[b] * s, "{layout:?} token {i} head {h}");
                            assert_eq!(o[b], x[a] * s + x[b] * c, "{layout:?} token {i} head {h}");
                        }
                    }
                }
            }
        }
    }
}
