//! The training step's fused kernels, each with its hand-written backward:
//! RMSNorm, RoPE, SwiGLU, causal attention over variable-length examples
//! and the output head's softmax cross-entropy. They work on row-major
//! `f32` slices of the batch's real tokens only (examples laid end to end,
//! no padding), split rows over the rayon pool, and keep nothing that
//! grows with `tokens x vocabulary` or `tokens x tokens`.
//!
//! Hot loops are `<const FMA: bool>` bodies compiled for AVX2 + FMA where
//! the CPU has them (the pattern of `hearth_models::vecmath`).

use hearth_models::vecmath::{dot16, exp_with, has_fma, madd, max};
use rayon::prelude::*;

use super::ops::RopeLayout;

/// Calls `$body::<true>` inside an `avx2,fma` function when the CPU has
/// them, else `$body::<false>`; `$body` must be `#[inline(always)]` so that
/// it is compiled into that function.
macro_rules! simd {
    ($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {{
        #[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
        unsafe fn fast($($arg: $ty),*) $(-> $ret)? {
            $name::<true>($($arg),*)
        }
        if has_fma() {
            // SAFETY: the CPU has the features `fast` is compiled for.
            unsafe { fast($($arg),*) }
        } else {
            $name::<false>($($arg),*)
        }
    }};
}

/// `y += a x`.
#[inline(always)]
fn axpy<const FMA: bool>(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = madd::<FMA>(a, x, *y);
    }
}

// ---------------------------------------------------------------- RMSNorm

/// `out = x * r * w` per row of width `w.len()`, with `r = 1 / sqrt(mean(x^2)
/// + eps)`; returns `r` per row (kept for the backward).
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) -> Vec<f32> {
    #[inline(always)]
    fn row<const FMA: bool>(x: &[f32], w: &[f32], eps: f32, o: &mut [f32]) -> f32 {
        let r = 1.0 / (dot16::<FMA>(x, x) / w.len() as f32 + eps).sqrt();
        for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
            *o = x * r * w;
        }
        r
    }
    let h = w.len();
    let mut r = vec![0f32; x.len() / h];
    out.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .zip(r.par_iter_mut())
        .for_each(|((o, x), r)| {
            *r = simd!(row(x: &[f32], w: &[f32], eps: f32, o: &mut [f32]) -> f32)
        });
    r
}

/// `dx += d(rms_norm)/dx . dy` (the weight is frozen: no gradient for it).
pub(crate) fn rms_norm_backward(dy: &[f32], x: &[f32], r: &[f32], w: &[f32], dx: &mut [f32]) {
    #[inline(always)]
    fn row<const FMA: bool>(dy: &[f32], x: &[f32], r: f32, w: &[f32], dx: &mut [f32]) {
        // g = dy * w; dx = r g - x r^3 (g . x) / h
        let mut acc = [0f32; 16];
        let mut tail = 0f32;
        let mut i = 0;
        while i + 16 <= x.len() {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = madd::<FMA>(dy[i + k] * w[i + k], x[i + k], *a);
            }
            i += 16;
        }
        for k in i..x.len() {
            tail = madd::<FMA>(dy[k] * w[k], x[k], tail);
        }
        let gx = acc.iter().sum::<f32>() + tail;
        let c = r * r * r * gx / w.len() as f32;
        for (((dx, &dy), &w), &x) in dx.iter_mut().zip(dy).zip(w).zip(x) {
            *dx += r * dy * w - c * x;
        }
    }
    let h = w.len();
    dx.par_chunks_mut(h)
        .zip(dy.par_chunks(h).zip(x.par_chunks(h)))
        .zip(r.par_iter())
        .for_each(|((dx, (dy, x)), &r)| simd!(row(dy: &[f32], x: &[f32], r: f32, w: &[f32], dx: &mut [f32])));
}

// ------------------------------------------------------------------- RoPE

/// Rotary tables: `cos`/`sin` `[positions, head_dim / 2]`.
#[derive(Clone, Copy)]
pub(crate) struct Rope<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub head_dim: usize,
    pub layout: RopeLayout,
}

impl Rope<'_> {
    /// Rotates every head of every row of `x` (`[tokens, heads * head_dim]`)
    /// by its token's position; `inverse` rotates back (the backward of a
    /// rotation is its transpose).
    pub(crate) fn apply(&self, x: &mut [f32], positions: &[u32], inverse: bool) {
        let d = self.head_dim;
        let half = d / 2;
        let width = x.len() / positions.len().max(1);
        x.par_chunks_mut(width)
            .zip(positions.par_iter())
            .for_each(|(row, &p)| {
                let off = p as usize * half;
                let (cos, sin) = (&self.cos[off..off + half], &self.sin[off..off + half]);
                for head in row.chunks_exact_mut(d) {
                    for j in 0..half {
                        let (c, s) = (cos[j], if inverse { -sin[j] } else { sin[j] });
                        let (a, b) = match self.layout {
                            RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                            RopeLayout::Halves => (j, j + half),
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * c - x1 * s;
                        head[b] = x0 * s + x1 * c;
                    }
                }
            });
    }
}

// ----------------------------------------------------------------- SwiGLU

/// Elements per parallel task of the element-wise kernels.
const CHUNK: usize = 4096;

#[inline(always)]
fn sigmoid<const FMA: bool>(g: f32) -> f32 {
    1.0 / (1.0 + exp_with::<FMA>(-g))
}

/// `h = silu(g) * u`.
pub(crate) fn silu_mul(g: &[f32], u: &[f32], h: &mut [f32]) {
    #[inline(always)]
    fn chunk<const FMA: bool>(h: &mut [f32], g: &[f32], u: &[f32]) {
        for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
            *h = g * sigmoid::<FMA>(g) * u;
        }
    }
    h.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|(h, (g, u))| simd!(chunk(h: &mut [f32], g: &[f32], u: &[f32])));
}

/// Gradients `dg`, `du` of `silu(g) * u` given `dh` (overwritten).
pub(crate) fn silu_mul_backward(dh: &[f32], g: &[f32], u: &[f32], dg: &mut [f32], du: &mut [f32]) {
    #[inline(always)]
    fn chunk<const FMA: bool>(dg: &mut [f32], du: &mut [f32], dh: &[f32], g: &[f32], u: &[f32]) {
        for i in 0..g.len() {
            let s = sigmoid::<FMA>(g[i]);
            du[i] = dh[i] * g[i] * s;
            dg[i] = dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        }
    }
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(dh.par_chunks(CHUNK).zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))))
        .for_each(|((dg, du), (dh, (g, u)))| {
            simd!(chunk(dg: &mut [f32], du: &mut [f32], dh: &[f32], g: &[f32], u: &[f32]))
        });
}

// -------------------------------------------------------------- Attention

/// Heads of the attention: `heads` query heads over `kv_heads` key/value
/// heads (grouped-query attention), each `head_dim` wide.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Splits `x` (rows of `width`) into the mutable row ranges of `segs`
/// (consecutive `(start, len)` covering the rows in order).
fn split_rows<'a>(
    mut x: &'a mut [f32],
    segs: &[(usize, usize)],
    width: usize,
) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(segs.len());
    for &(_, len) in segs {
        let (a, b) = x.split_at_mut(len * width);
        out.push(a);
        x = b;
    }
    out
}

/// Causal attention inside each example: `o` `[tokens, heads * d]` (zeroed
/// by the caller) and the log-sum-exp of every (token, head)'s scores,
/// `lse` `[tokens, heads]` (kept for the backward, which recomputes the
/// probabilities from it). `segs` are the examples' `(start, len)`,
/// consecutive from row 0.
pub(crate) fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    segs: &[(usize, usize)],
    hd: Heads,
    o: &mut [f32],
    lse: &mut [f32],
) {
    /// One example: `o` and `lse` are its rows.
    #[inline(always)]
    fn segment<const FMA: bool>(
        qkv: (&[f32], &[f32], &[f32]),
        start: usize,
        hd: Heads,
        o: &mut [f32],
        lse: &mut [f32],
    ) {
        let (q, k, v) = qkv;
        let (nh, d) = (hd.heads, hd.head_dim);
        let (qw, kw, rep) = (nh * d, hd.kv_heads * d, nh / hd.kv_heads);
        let len = lse.len() / nh;
        let scale = 1.0 / (d as f32).sqrt();
        let mut s = vec![0f32; len];
        for i in 0..len {
            let qi = &q[(start + i) * qw..(start + i + 1) * qw];
            for h in 0..nh {
                let kh = (h / rep) * d;
                let qh = &qi[h * d..(h + 1) * d];
                for (j, s) in s[..=i].iter_mut().enumerate() {
                    *s = dot16::<FMA>(qh, &k[(start + j) * kw + kh..][..d]) * scale;
                }
                let m = max(&s[..=i]);
                let mut sum = 0f32;
                for s in s[..=i].iter_mut() {
                    *s = exp_with::<FMA>(*s - m);
                    sum += *s;
                }
                lse[i * nh + h] = m + sum.ln();
                let oh = &mut o[i * qw + h * d..][..d];
                let inv = 1.0 / sum;
                for (j, &p) in s[..=i].iter().enumerate() {
                    axpy::<FMA>(oh, p * inv, &v[(start + j) * kw + kh..][..d]);
                }
            }
        }
    }
    split_rows(o, segs, hd.heads * hd.head_dim)
        .into_par_iter()
        .zip(split_rows(lse, segs, hd.heads))
        .zip(segs.par_iter())
        .for_each(|((o, lse), &(start, _))| {
            let qkv = (q, k, v);
            simd!(segment(qkv: (&[f32], &[f32], &[f32]), start: usize, hd: Heads, o: &mut [f32], lse: &mut [f32]))
        });
}

/// Attention's inputs and the forward's outputs the backward reads.
#[derive(Clone, Copy)]
pub(crate) struct AttentionSaved<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub o: &'a [f32],
    pub lse: &'a [f32],
}

/// Gradients `dq`, `dk`, `dv` (zeroed by the caller) of [`attention`] given
/// `d_o`.
pub(crate) fn attention_backward(
    saved: AttentionSaved<'_>,
    d_o: &[f32],
    segs: &[(usize, usize)],
    hd: Heads,
    grads: (&mut [f32], &mut [f32], &mut [f32]),
) {
    /// One example: `dq`, `dk` and `dv` are its rows.
    #[inline(always)]
    fn segment<const FMA: bool>(
        sv: AttentionSaved<'_>,
        d_o: &[f32],
        start: usize,
        hd: Heads,
        dq: &mut [f32],
        dkv: (&mut [f32], &mut [f32]),
    ) {
        let (dk, dv) = dkv;
        let (nh, d) = (hd.heads, hd.head_dim);
        let (qw, kw, rep) = (nh * d, hd.kv_heads * d, nh / hd.kv_heads);
        let len = dq.len() / qw;
        let scale = 1.0 / (d as f32).sqrt();
        for h in 0..nh {
            let kh = (h / rep) * d;
            for i in 0..len {
                let qi = (start + i) * qw + h * d;
                let qh = &sv.q[qi..qi + d];
                let doh = &d_o[qi..qi + d];
                let delta = dot16::<FMA>(doh, &sv.o[qi..qi + d]);
                let l = sv.lse[(start + i) * nh + h];
                for j in 0..=i {
                    let kj = (start + j) * kw + kh;
                    let (kr, vr) = (&sv.k[kj..kj + d], &sv.v[kj..kj + d]);
                    let p = exp_with::<FMA>(dot16::<FMA>(qh, kr) * scale - l);
                    let ds = p * (dot16::<FMA>(doh, vr) - delta) * scale;
                    axpy::<FMA>(&mut dq[i * qw + h * d..][..d], ds, kr);
                    axpy::<FMA>(&mut dk[j * kw + kh..][..d], ds, qh);
                    axpy::<FMA>(&mut dv[j * kw + kh..][..d], p, doh);
                }
            }
        }
    }
    let (qw, kw) = (hd.heads * hd.head_dim, hd.kv_heads * hd.head_dim);
    let (dq, dk, dv) = grads;
    split_rows(dq, segs, qw)
        .into_par_iter()
        .zip(split_rows(dk, segs, kw))
        .zip(split_rows(dv, segs, kw))
        .zip(segs.par_iter())
        .for_each(|(((dq, dk), dv), &(start, _))| {
            let dkv = (dk, dv);
            simd!(segment(saved: AttentionSaved<'_>, d_o: &[f32], start: usize, hd: Heads, dq: &mut [f32], dkv: (&mut [f32], &mut [f32])))
        });
}

// ------------------------------------------------------ Softmax + NLL head

/// For rows of `logits` (`[rows, vocab]`) and their targets: adds each
/// row's `-log_softmax[target]` to the returned sum and, when `grad_scale`
/// is given, overwrites the row with `grad_scale * (softmax - onehot)`,
/// the gradient of `grad_scale * loss` with respect to the logits.
pub(crate) fn softmax_nll_rows(
    logits: &mut [f32],
    targets: &[u32],
    grad_scale: Option<f32>,
) -> f64 {
    #[inline(always)]
    fn row<const FMA: bool>(row: &mut [f32], t: u32, grad_scale: Option<f32>) -> f64 {
        let m = max(row);
        let mut acc = [0f32; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a += exp_with::<FMA>(x - m);
            }
        }
        let mut sum = 0f32;
        for &x in chunks.remainder() {
            sum += exp_with::<FMA>(x - m);
        }
        sum += acc.iter().sum::<f32>();
        let loss = (m + sum.ln() - row[t as usize]) as f64;
        if let Some(g) = grad_scale {
            let c = g / sum;
            for x in row.iter_mut() {
                *x = exp_with::<FMA>(*x - m) * c;
            }
            row[t as usize] -= g;
        }
        loss
    }
    let vocab = logits.len() / targets.len().max(1);
    logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(r, &t)| simd!(row(r: &mut [f32], t: u32, grad_scale: Option<f32>) -> f64))
        .sum()
}
