//! One training step written out by hand: the Llama forward with LoRA over
//! the batch's real tokens (examples end to end, no padding), keeping only
//! what the backward needs per layer (`tokens x hidden` sized: inputs,
//! norms, q/k/v, the attention output and its log-sum-exp, the MLP's gate
//! and up, LoRA's `x A^T`), the output head and cross-entropy fused per
//! chunk of rows (never all the logits at once), then the backward layer by
//! layer, computing gradients for the LoRA matrices only.
//!
//! Same mathematics as [`super::model::Forward`] (candle autograd), which
//! stays as the reference the tests compare against; dropout masks come
//! from the same seeds but cover unpadded rows.

use std::ops::Deref;
use std::sync::Mutex;

use candle_core::{CpuStorage, Storage, Tensor};

use super::base::BaseWeights;
use super::buffers::Buffers;
use super::gemm::{matmul, M};
use super::kernels::{self, AttentionSaved, Heads, Rope};
use super::model::{Dropout, TokenizedExample};
use super::optim::Rng;
use crate::TrainError;

/// Rows of the output head computed at once: `ROWS x vocab` logits.
const HEAD_ROWS: usize = 64;

/// A batch's real tokens, examples end to end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tokens {
    pub ids: Vec<u32>,
    /// Position of each token inside its example.
    pub positions: Vec<u32>,
    /// `(start, len)` of each example.
    pub segs: Vec<(usize, usize)>,
    /// Rows whose output predicts a loss token, and those tokens.
    pub loss_rows: Vec<u32>,
    pub targets: Vec<u32>,
}

impl Tokens {
    pub(crate) fn new(examples: &[&TokenizedExample]) -> Tokens {
        let mut t = Tokens::default();
        for e in examples {
            let start = t.ids.len();
            for (p, &tok) in e.tokens.iter().enumerate() {
                if p > 0 && e.loss[p] {
                    t.loss_rows.push((start + p - 1) as u32);
                    t.targets.push(tok);
                }
                t.ids.push(tok);
                t.positions.push(p as u32);
            }
            t.segs.push((start, e.tokens.len()));
        }
        t
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// A read-only view of an f32 CPU tensor's elements.
struct View<'a> {
    guard: Box<dyn Deref<Target = Storage> + 'a>,
    range: (usize, usize),
}

impl View<'_> {
    fn s(&self) -> &[f32] {
        match &**self.guard {
            Storage::Cpu(CpuStorage::F32(v)) => &v[self.range.0..self.range.1],
            _ => &[],
        }
    }
}

fn view(t: &Tensor) -> Result<View<'_>, TrainError> {
    let (guard, layout) = t.storage_and_layout();
    let range = layout
        .contiguous_offsets()
        .ok_or_else(|| TrainError::Model("a weight is not contiguous".into()))?;
    if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
        return Err(TrainError::Model("weights must be f32 on the CPU".into()));
    }
    Ok(View {
        guard: Box::new(guard),
        range,
    })
}

/// One linear's frozen weight and, when trained, its LoRA matrices.
struct Linear<'a> {
    w: View<'a>,
    out: usize,
    inp: usize,
    /// `A` `[r, in]`, `B` `[out, r]`.
    ab: Option<(View<'a>, View<'a>)>,
}

/// LoRA matrices of every layer and target, `(A, B)` in
/// `LoraTarget::ALL` order, and their scale.
pub(crate) struct Adapter<'a> {
    pub ab: &'a [[(Tensor, Tensor); 7]],
    pub scale: f32,
    pub rank: usize,
}

/// Gradients of every `(A, B)` in the adapter's order, flattened.
pub(crate) type Grads = Vec<[(Vec<f32>, Vec<f32>); 7]>;

/// What the backward of one layer reads.
/// The normed inputs of the linears are not kept: the backward recomputes
/// them from `x` / `x2` (a few passes over the rows against `2 x hidden`
/// floats per token and layer).
struct Saved {
    x: Vec<f32>,
    r1: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    lse: Vec<f32>,
    x2: Vec<f32>,
    r2: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    /// `dropout(x) A^T` per target.
    xa: [Vec<f32>; 7],
}

impl Saved {
    fn give_back(self, bufs: &mut Buffers) {
        let [a, b, c, d, e, f, g] = self.xa;
        for v in [
            self.x, self.r1, self.q, self.k, self.v, self.o, self.lse, self.x2, self.r2, self.g,
            self.u, a, b, c, d, e, f, g,
        ] {
            bufs.give(v);
        }
    }
}

/// The step's fixed inputs, and the buffers it reuses.
pub(crate) struct Step<'a> {
    pub base: &'a BaseWeights,
    pub adapter: Option<Adapter<'a>>,
    pub dropout: Option<Dropout>,
    pub bufs: &'a Mutex<Buffers>,
}

impl Step<'_> {
    fn zeros(&self, len: usize) -> Vec<f32> {
        self.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .zeros(len)
    }

    fn give(&self, v: Vec<f32>) {
        self.bufs.lock().unwrap_or_else(|e| e.into_inner()).give(v)
    }

    /// `a b` into a buffer of the pool.
    fn product(&self, a: M<'_>, b: M<'_>, rows: usize, cols: usize) -> Vec<f32> {
        let mut out = self.zeros(rows * cols);
        matmul(&mut out, a, b, 1.0, false);
        out
    }

    fn linear(&self, layer: usize, t: usize) -> Result<Linear<'_>, TrainError> {
        let w = &self.base.layers[layer].linears[t];
        let (out, inp) = w.dims2()?;
        let ab = match &self.adapter {
            Some(a) => {
                let (ta, tb) = &a.ab[layer][t];
                Some((view(ta)?, view(tb)?))
            }
            None => None,
        };
        Ok(Linear {
            w: view(w)?,
            out,
            inp,
            ab,
        })
    }

    /// The dropout mask of `(layer, target)` over `n` values (`1 / keep`
    /// or 0), as [`super::model::Forward`] draws it.
    fn mask(&self, layer: usize, t: usize, n: usize) -> Option<Vec<f32>> {
        let d = self.dropout.filter(|d| d.p > 0.0)?;
        self.adapter.as_ref()?;
        let mut rng = Rng::from_parts(&[d.seed, d.step, layer as u64, t as u64]);
        let keep = 1.0 - d.p;
        Some(
            (0..n)
                .map(|_| {
                    if rng.next_f64() < keep {
                        (1.0 / keep) as f32
                    } else {
                        0.0
                    }
                })
                .collect(),
        )
    }

    /// `x` times the dropout mask `m`, in a buffer of the pool.
    fn masked(&self, x: &[f32], m: &[f32]) -> Vec<f32> {
        let mut out = self.zeros(x.len());
        for ((o, x), m) in out.iter_mut().zip(x).zip(m) {
            *o = x * m;
        }
        out
    }

    /// `x W^T + s dropout(x) A^T B^T` for `n` rows; also `dropout(x) A^T`.
    fn linear_fwd(
        &self,
        layer: usize,
        t: usize,
        x: &[f32],
        n: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
        let lin = self.linear(layer, t)?;
        let w = M::new(lin.w.s(), lin.out, lin.inp);
        let mut y = self.product(M::new(x, n, lin.inp), w.t(), n, lin.out);
        let Some((a, b)) = &lin.ab else {
            return Ok((y, Vec::new()));
        };
        let ad = self
            .adapter
            .as_ref()
            .expect("an adapter with LoRA matrices");
        let r = ad.rank;
        let masked = self.mask(layer, t, x.len()).map(|m| self.masked(x, &m));
        let xin = masked.as_deref().unwrap_or(x);
        let xa = self.product(M::new(xin, n, lin.inp), M::new(a.s(), r, lin.inp).t(), n, r);
        if let Some(m) = masked {
            self.give(m);
        }
        matmul(
            &mut y,
            M::new(&xa, n, r),
            M::new(b.s(), lin.out, r).t(),
            ad.scale,
            true,
        );
        Ok((y, xa))
    }

    /// Adds the input gradient to `dx` (when it is wanted) and writes the
    /// LoRA gradients.
    #[allow(clippy::too_many_arguments)]
    fn linear_bwd(
        &self,
        layer: usize,
        t: usize,
        dy: &[f32],
        x: &[f32],
        xa: &[f32],
        n: usize,
        mut dx: Option<&mut [f32]>,
        grads: &mut Grads,
    ) -> Result<(), TrainError> {
        let lin = self.linear(layer, t)?;
        let dym = M::new(dy, n, lin.out);
        if let Some(dx) = dx.as_deref_mut() {
            matmul(dx, dym, M::new(lin.w.s(), lin.out, lin.inp), 1.0, true);
        }
        let Some((a, b)) = &lin.ab else {
            return Ok(());
        };
        let ad = self
            .adapter
            .as_ref()
            .expect("an adapter with LoRA matrices");
        let (r, s) = (ad.rank, ad.scale);
        // dB = s dy^T (x A^T); dA = s (dy B)^T dropout(x); dx += s (dy B) A.
        let mut db = vec![0f32; lin.out * r];
        matmul(&mut db, dym.t(), M::new(xa, n, r), s, false);
        let dyb = self.product(dym, M::new(b.s(), lin.out, r), n, r);
        let mask = self.mask(layer, t, x.len());
        let masked = mask.as_ref().map(|m| self.masked(x, m));
        let mut da = vec![0f32; r * lin.inp];
        let xin = masked.as_deref().unwrap_or(x);
        matmul(
            &mut da,
            M::new(&dyb, n, r).t(),
            M::new(xin, n, lin.inp),
            s,
            false,
        );
        match (dx, mask) {
            (None, _) => {}
            (Some(dx), None) => matmul(dx, M::new(&dyb, n, r), M::new(a.s(), r, lin.inp), s, true),
            (Some(dx), Some(m)) => {
                let d = self.product(M::new(&dyb, n, r), M::new(a.s(), r, lin.inp), n, lin.inp);
                for ((dx, d), m) in dx.iter_mut().zip(&d).zip(m) {
                    *dx += s * d * m;
                }
                self.give(d);
            }
        }
        for v in [dyb].into_iter().chain(masked) {
            self.give(v);
        }
        grads[layer][t] = (da, db);
        Ok(())
    }

    fn heads(&self) -> Heads {
        let d = &self.base.dims;
        Heads {
            heads: d.heads,
            kv_heads: d.kv_heads,
            head_dim: d.head_dim,
        }
    }

    /// One block's forward from `x` (moved into the saved state).
    fn layer_fwd(
        &self,
        l: usize,
        x: Vec<f32>,
        tk: &Tokens,
        rope: Rope<'_>,
    ) -> Result<(Vec<f32>, Saved), TrainError> {
        let base = self.base;
        let n = tk.len();
        let lw = &base.layers[l];
        let eps = base.eps as f32;
        let (h, heads) = (base.dims.hidden, self.heads());
        let mut n1 = self.zeros(n * h);
        let r1 = kernels::rms_norm(&x, view(&lw.attn_norm)?.s(), eps, &mut n1);
        let (mut q, xa_q) = self.linear_fwd(l, 0, &n1, n)?;
        let (mut k, xa_k) = self.linear_fwd(l, 1, &n1, n)?;
        let (v, xa_v) = self.linear_fwd(l, 2, &n1, n)?;
        self.give(n1);
        rope.apply(&mut q, &tk.positions, false);
        rope.apply(&mut k, &tk.positions, false);
        let mut o = self.zeros(q.len());
        let mut lse = self.zeros(n * heads.heads);
        kernels::attention(&q, &k, &v, &tk.segs, heads, &mut o, &mut lse);
        let (mut x2, xa_o) = self.linear_fwd(l, 3, &o, n)?;
        for (y, x) in x2.iter_mut().zip(&x) {
            *y += x;
        }
        let mut n2 = self.zeros(n * h);
        let r2 = kernels::rms_norm(&x2, view(&lw.ffn_norm)?.s(), eps, &mut n2);
        let (g, xa_g) = self.linear_fwd(l, 4, &n2, n)?;
        let (u, xa_u) = self.linear_fwd(l, 5, &n2, n)?;
        self.give(n2);
        let mut act = self.zeros(g.len());
        kernels::silu_mul(&g, &u, &mut act);
        let (mut out, xa_d) = self.linear_fwd(l, 6, &act, n)?;
        self.give(act);
        for (y, x) in out.iter_mut().zip(&x2) {
            *y += x;
        }
        Ok((
            out,
            Saved {
                x,
                r1,
                q,
                k,
                v,
                o,
                lse,
                x2,
                r2,
                g,
                u,
                xa: [xa_q, xa_k, xa_v, xa_o, xa_g, xa_u, xa_d],
            },
        ))
    }

    /// One block's backward: `dx` (the gradient of its output) becomes the
    /// gradient of its input (empty for the first block).
    fn layer_bwd(
        &self,
        l: usize,
        s: Saved,
        dx: Vec<f32>,
        tk: &Tokens,
        rope: Rope<'_>,
        grads: &mut Grads,
    ) -> Result<Vec<f32>, TrainError> {
        let base = self.base;
        let dims = &base.dims;
        let n = tk.len();
        let lw = &base.layers[l];
        let (h, inter) = (dims.hidden, dims.intermediate);
        let kv_width = dims.kv_heads * dims.head_dim;
        // MLP
        let mut act = self.zeros(n * inter);
        kernels::silu_mul(&s.g, &s.u, &mut act);
        let mut dact = self.zeros(n * inter);
        self.linear_bwd(l, 6, &dx, &act, &s.xa[6], n, Some(&mut dact), grads)?;
        let (mut dg, mut du) = (act, self.zeros(n * inter));
        kernels::silu_mul_backward(&dact, &s.g, &s.u, &mut dg, &mut du);
        self.give(dact);
        let eps = base.eps as f32;
        let mut n2 = self.zeros(n * h);
        kernels::rms_norm(&s.x2, view(&lw.ffn_norm)?.s(), eps, &mut n2);
        let mut dn2 = self.zeros(n * h);
        self.linear_bwd(l, 4, &dg, &n2, &s.xa[4], n, Some(&mut dn2), grads)?;
        self.linear_bwd(l, 5, &du, &n2, &s.xa[5], n, Some(&mut dn2), grads)?;
        for v in [dg, du, n2] {
            self.give(v);
        }
        let mut dx2 = dx;
        kernels::rms_norm_backward(&dn2, &s.x2, &s.r2, view(&lw.ffn_norm)?.s(), &mut dx2);
        // Attention
        let mut d_o = dn2;
        d_o.fill(0.0);
        d_o.resize(s.o.len(), 0.0);
        self.linear_bwd(l, 3, &dx2, &s.o, &s.xa[3], n, Some(&mut d_o), grads)?;
        let saved = AttentionSaved {
            q: &s.q,
            k: &s.k,
            v: &s.v,
            o: &s.o,
            lse: &s.lse,
        };
        let mut dq = self.zeros(s.q.len());
        let (mut dk, mut dv) = (self.zeros(n * kv_width), self.zeros(n * kv_width));
        let dqkv = (&mut dq[..], &mut dk[..], &mut dv[..]);
        kernels::attention_backward(saved, &d_o, &tk.segs, self.heads(), dqkv);
        self.give(d_o);
        rope.apply(&mut dq, &tk.positions, true);
        rope.apply(&mut dk, &tk.positions, true);
        // The first block's input gradient would only reach the frozen
        // embedding: its q/k/v input gradients are not computed.
        let mut n1 = self.zeros(n * h);
        kernels::rms_norm(&s.x, view(&lw.attn_norm)?.s(), eps, &mut n1);
        let mut dn1 = self.zeros(if l == 0 { 0 } else { n * h });
        for (t, dy) in [&dq, &dk, &dv].into_iter().enumerate() {
            let dn1 = if l == 0 { None } else { Some(&mut dn1[..]) };
            self.linear_bwd(l, t, dy, &n1, &s.xa[t], n, dn1, grads)?;
        }
        for v in [dq, dk, dv, n1] {
            self.give(v);
        }
        let mut dx_in = dx2;
        if l == 0 {
            dx_in.clear();
        } else {
            kernels::rms_norm_backward(&dn1, &s.x, &s.r1, view(&lw.attn_norm)?.s(), &mut dx_in);
        }
        self.give(dn1);
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        s.give_back(&mut bufs);
        Ok(dx_in)
    }

    /// The summed loss over the batch's loss tokens and, with `backward`,
    /// the LoRA gradients of `loss_sum * grad_scale`.
    pub(crate) fn run(
        &self,
        tk: &Tokens,
        backward: Option<f32>,
    ) -> Result<(f64, Option<Grads>), TrainError> {
        let result = self.forward_backward(tk, backward);
        self.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end_step();
        result
    }

    fn forward_backward(
        &self,
        tk: &Tokens,
        backward: Option<f32>,
    ) -> Result<(f64, Option<Grads>), TrainError> {
        let base = self.base;
        let dims = base.dims;
        let (n, h) = (tk.len(), dims.hidden);
        let cos = view(&base.cos)?;
        let sin = view(&base.sin)?;
        let rope = Rope {
            cos: cos.s(),
            sin: sin.s(),
            head_dim: dims.head_dim,
            layout: base.layout,
        };
        let mut x = self.zeros(n * h);
        {
            let emb = view(&base.embed)?;
            for (row, &id) in x.chunks_exact_mut(h).zip(&tk.ids) {
                row.copy_from_slice(&emb.s()[id as usize * h..(id as usize + 1) * h]);
            }
        }
        let mut saved = Vec::with_capacity(if backward.is_some() { dims.layers } else { 0 });
        for l in 0..dims.layers {
            let (out, s) = self.layer_fwd(l, x, tk, rope)?;
            if backward.is_some() {
                saved.push(s);
            } else {
                s.give_back(&mut self.bufs.lock().unwrap_or_else(|e| e.into_inner()));
            }
            x = out;
        }
        // Head: final norm on the loss rows, logits and cross-entropy per
        // chunk of rows, and the gradient back to those rows.
        let nl = tk.loss_rows.len();
        let mut hx = self.zeros(nl * h);
        for (row, &r) in hx.chunks_exact_mut(h).zip(&tk.loss_rows) {
            row.copy_from_slice(&x[r as usize * h..(r as usize + 1) * h]);
        }
        self.give(x);
        let norm = view(&base.norm)?;
        let mut hn = self.zeros(nl * h);
        let rn = kernels::rms_norm(&hx, norm.s(), base.eps as f32, &mut hn);
        let head = view(&base.lm_head)?;
        let head = M::new(head.s(), dims.vocab, h);
        let mut dhn = self.zeros(if backward.is_some() { nl * h } else { 0 });
        let mut loss = 0f64;
        let mut logits = self.zeros(HEAD_ROWS.min(nl) * dims.vocab);
        for c in (0..nl).step_by(HEAD_ROWS) {
            let rows = HEAD_ROWS.min(nl - c);
            let lg = &mut logits[..rows * dims.vocab];
            matmul(
                lg,
                M::new(&hn[c * h..(c + rows) * h], rows, h),
                head.t(),
                1.0,
                false,
            );
            loss += kernels::softmax_nll_rows(lg, &tk.targets[c..c + rows], backward);
            if backward.is_some() {
                matmul(
                    &mut dhn[c * h..(c + rows) * h],
                    M::new(lg, rows, dims.vocab),
                    head,
                    1.0,
                    false,
                );
            }
        }
        self.give(logits);
        self.give(hn);
        let Some(_) = backward else {
            self.give(hx);
            self.give(dhn);
            return Ok((loss, None));
        };
        let mut dhx = self.zeros(nl * h);
        kernels::rms_norm_backward(&dhn, &hx, &rn, norm.s(), &mut dhx);
        let mut dx = self.zeros(n * h);
        for (row, &r) in dhx.chunks_exact(h).zip(&tk.loss_rows) {
            dx[r as usize * h..(r as usize + 1) * h].copy_from_slice(row);
        }
        for v in [hx, dhn, dhx] {
            self.give(v);
        }
        let empty = || (Vec::new(), Vec::new());
        let mut grads: Grads = (0..dims.layers)
            .map(|_| std::array::from_fn(|_| empty()))
            .collect();
        for l in (0..dims.layers).rev() {
            let s = saved.pop().expect("one saved state per layer");
            dx = self.layer_bwd(l, s, dx, tk, rope, &mut grads)?;
        }
        self.give(dx);
        Ok((loss, Some(grads)))
    }
}
