//! The attention of one task (one sequence, one KV head, a run of query
//! rows) over its blocks: see the parent module for the algorithm. The
//! loops are compiled for AVX2 + FMA where the CPU has them.

use super::{round_to, AttnShape, KvPool, SeqView, BLOCK_SIZE};
use crate::vecmath;

/// Blocks ahead whose keys and values a decode task asks for (8: 16-64
/// KiB of f16 for head sizes 64-256; 4 was slower, 8 to 16 the same).
const PREFETCH_BLOCKS: usize = 8;

/// One attention task: rows `r0..r1` of one sequence, the query heads of
/// KV head `g`.
pub(super) struct Task<'a> {
    pub(super) pool: &'a KvPool,
    pub(super) layer: usize,
    pub(super) q: &'a [f32],
    pub(super) shape: AttnShape,
    pub(super) seq: &'a SeqView<'a>,
    pub(super) g: usize,
    pub(super) r0: usize,
    pub(super) r1: usize,
    /// The decode task after this one in the call's list (the same
    /// thread's next, unless another thread takes it), whose first blocks
    /// this one asks for as it ends.
    pub(super) next: Option<Next<'a>>,
}

/// The sequence, KV head and last block of a decode task's successor.
#[derive(Clone, Copy)]
pub(super) struct Next<'a> {
    pub(super) seq: &'a SeqView<'a>,
    pub(super) g: usize,
    pub(super) last: usize,
}

impl Task<'_> {
    /// Returns `[(r1 - r0) * n_rep, d]`, row-major by (row, head within the
    /// group), with the AVX2 + FMA body where the CPU has it.
    pub(super) fn attend(&self) -> Vec<f32> {
        self.attend_with(true)
    }

    /// [`Task::attend`]; with `wide` false, never the 512-bit body (tests
    /// compare the two).
    pub(super) fn attend_with(&self, wide: bool) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if wide && super::attend_wide::available(self.pool.head_dim) {
            // SAFETY: `available` checked the features `run_wide` is
            // compiled for.
            return unsafe { self.run_wide() };
        }
        #[cfg(target_arch = "x86_64")]
        if vecmath::has_fma() {
            #[target_feature(enable = "avx2,fma,f16c")]
            fn run_fma(task: &Task<'_>) -> Vec<f32> {
                // It spills ymm registers (four slots): aligned ones.
                hearth_kernels::align_frame!();
                task.run::<true>()
            }
            // SAFETY: the CPU has the features `run_fma` is compiled for.
            return unsafe { run_fma(self) };
        }
        self.run::<false>()
    }

    /// Per key block: the block's keys, stored transposed (`[d, 16]`), give
    /// a query's 16 scores as 16 lanes accumulated over `d` (no horizontal
    /// sums); the online-softmax update with the 16 exponentials at once;
    /// then the weighted values added to the query's accumulator.
    #[inline(always)]
    fn run<const FMA: bool>(&self) -> Vec<f32> {
        let Task {
            pool,
            layer,
            seq,
            g,
            r1,
            ..
        } = *self;
        let d = pool.head_dim;
        let State {
            qs,
            n_rep,
            nq,
            mut m,
            mut l,
            mut acc,
            mut kt,
            mut vb,
            mut scores,
        } = self.state();
        let last = seq.pos + r1 - 1;
        for b in 0..=last / BLOCK_SIZE {
            let block = seq.blocks[b];
            pool.read_block(layer, false, block, g, &mut kt);
            pool.read_block(layer, true, block, g, &mut vb);
            self.prefetch_ahead(b);
            let base = b * BLOCK_SIZE;
            let first = self.first_query(base, n_rep, nq);
            block_scores::<FMA>(&qs[first * d..], &kt, d, &mut scores[first * BLOCK_SIZE..]);
            for qi in first..nq {
                let valid = self.visible(qi, base, n_rep);
                let s = &scores[qi * BLOCK_SIZE..(qi + 1) * BLOCK_SIZE];
                let mx = s[..valid].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let new_m = m[qi].max(mx);
                let corr = vecmath::exp(m[qi] - new_m);
                let mut e = [0f32; BLOCK_SIZE];
                for (e, &s) in e.iter_mut().zip(s) {
                    *e = vecmath::exp(s - new_m);
                }
                e[valid..].iter_mut().for_each(|e| *e = 0.0);
                l[qi] = l[qi] * corr + sum16(&e);
                add_values::<FMA>(&mut acc[qi * d..(qi + 1) * d], corr, &e[..valid], &vb);
                m[qi] = new_m;
            }
        }
        normalize(&mut acc, &l);
        acc
    }

    /// For a decode task (at most 8 queries: one or a few new rows), asks
    /// for the keys and values of the block [`PREFETCH_BLOCKS`] after
    /// block `b`, past its last block those of the next decode task
    /// ([`Task::next`]), so that a task's first blocks do not wait on
    /// memory either; prompt chunks spend long enough on each block that
    /// the hardware prefetchers keep up.
    #[inline(always)]
    pub(super) fn prefetch_ahead(&self, b: usize) {
        if !self.is_decode() {
            return;
        }
        let last = self.last_block();
        let ahead = b + PREFETCH_BLOCKS;
        if ahead <= last {
            self.pool
                .prefetch_block(self.layer, self.seq.blocks[ahead], self.g);
        } else if let Some(next) = self.next {
            let nb = ahead - last - 1;
            if nb <= next.last {
                self.pool
                    .prefetch_block(self.layer, next.seq.blocks[nb], next.g);
            }
        }
    }

    /// Whether the task has at most 8 queries (one or a few new rows).
    pub(super) fn is_decode(&self) -> bool {
        (self.r1 - self.r0) * (self.shape.num_heads / self.pool.num_kv_heads) <= 8
    }

    /// The task's last block.
    pub(super) fn last_block(&self) -> usize {
        (self.seq.pos + self.r1 - 1) / BLOCK_SIZE
    }

    /// The task's queries and a fresh online softmax over them.
    pub(super) fn state(&self) -> State {
        let d = self.pool.head_dim;
        let (qs, n_rep) = self.queries();
        let nq = qs.len() / d;
        State {
            qs,
            n_rep,
            nq,
            m: vec![f32::NEG_INFINITY; nq],
            l: vec![0f32; nq],
            acc: vec![0f32; nq * d],
            kt: vec![0f32; BLOCK_SIZE * d],
            vb: vec![0f32; BLOCK_SIZE * d],
            scores: vec![0f32; nq * BLOCK_SIZE],
        }
    }

    /// The task's query rows, `[(r1 - r0) * n_rep, d]` by (row, head within
    /// the group), rounded to the pool's precision and scaled by `1 /
    /// sqrt(d)`; and `n_rep`.
    pub(super) fn queries(&self) -> (Vec<f32>, usize) {
        let Task {
            pool,
            q,
            shape,
            seq,
            g,
            r0,
            r1,
            ..
        } = *self;
        let (nh, t, d) = (shape.num_heads, shape.tokens, pool.head_dim);
        let n_rep = nh / pool.num_kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut qs = Vec::with_capacity((r1 - r0) * n_rep * d);
        for i in r0..r1 {
            for r in 0..n_rep {
                let h = g * n_rep + r;
                let at = (h * t + seq.offset + i) * d;
                qs.extend_from_slice(&q[at..at + d]);
            }
        }
        round_to(pool.dtype, &mut qs);
        qs.iter_mut().for_each(|x| *x *= scale);
        (qs, n_rep)
    }

    /// The first of the `nq` queries that sees the block starting at
    /// position `base` (queries of earlier rows of a chunk skip it), or
    /// `nq`.
    pub(super) fn first_query(&self, base: usize, n_rep: usize, nq: usize) -> usize {
        (0..nq)
            .find(|&qi| self.seq.pos + self.r0 + qi / n_rep >= base)
            .unwrap_or(nq)
    }

    /// How many keys of the block starting at `base` query `qi` sees.
    #[inline(always)]
    pub(super) fn visible(&self, qi: usize, base: usize, n_rep: usize) -> usize {
        let p = self.seq.pos + self.r0 + qi / n_rep;
        (p - base + 1).min(BLOCK_SIZE)
    }
}

/// One task's queries (`qs`, `nq` rows of `d`; `n_rep` query heads per KV
/// head), its online softmax (running maximum `m`, sum `l`, accumulated
/// values `acc`), and scratch for a block's keys (`kt`), values (`vb`) and
/// scores.
pub(super) struct State {
    pub(super) qs: Vec<f32>,
    pub(super) n_rep: usize,
    pub(super) nq: usize,
    pub(super) m: Vec<f32>,
    pub(super) l: Vec<f32>,
    pub(super) acc: Vec<f32>,
    pub(super) kt: Vec<f32>,
    pub(super) vb: Vec<f32>,
    pub(super) scores: Vec<f32>,
}

/// A block's 16 exponentials summed in a fixed tree: lanes `i` and `i + 8`,
/// then `i` and `i + 4`, `i` and `i + 2`, and the last two, the order in
/// which the 512-bit body adds a register's halves (so the same bits).
/// Added one after another, each sum waited on the one before: in prefill
/// the softmax's scalar work was four tenths of the attention's samples.
#[inline(always)]
pub(super) fn sum16(e: &[f32; BLOCK_SIZE]) -> f32 {
    let mut t = *e;
    let mut w = BLOCK_SIZE / 2;
    while w > 0 {
        for i in 0..w {
            t[i] += t[i + w];
        }
        w /= 2;
    }
    t[0]
}

/// Divides each query's accumulated values (`acc`, rows of `d`) by its
/// softmax sum `l`.
pub(super) fn normalize(acc: &mut [f32], l: &[f32]) {
    let d = acc.len() / l.len().max(1);
    for (row, &l) in acc.chunks_exact_mut(d.max(1)).zip(l) {
        let inv = 1.0 / l;
        row.iter_mut().for_each(|x| *x *= inv);
    }
}

/// `out[i * 16 + j] = q_i . key_j` for the queries `qs` (`[n, d]`) and one
/// block's keys transposed (`kt`, `[d, 16]`).
#[inline(always)]
fn block_scores<const FMA: bool>(qs: &[f32], kt: &[f32], d: usize, out: &mut [f32]) {
    let n = qs.len() / d;
    assert!(kt.len() == d * BLOCK_SIZE && out.len() >= n * BLOCK_SIZE);
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` bodies run only inside functions compiled with AVX2
        // and FMA on CPUs that have them; the lengths are asserted above.
        unsafe { fma::block_scores(qs, kt, d, out) };
        return;
    }
    for (q, s) in qs.chunks_exact(d).zip(out.chunks_exact_mut(BLOCK_SIZE)) {
        s.fill(0.0);
        for (&x, kc) in q.iter().zip(kt.chunks_exact(BLOCK_SIZE)) {
            for (s, &k) in s.iter_mut().zip(kc) {
                *s = vecmath::madd::<FMA>(x, k, *s);
            }
        }
    }
}

/// `acc = acc * corr + sum_j e_j v_j` over the first `e.len()` value rows
/// of a block (`vb`, `[16, d]`).
#[inline(always)]
fn add_values<const FMA: bool>(acc: &mut [f32], corr: f32, e: &[f32], vb: &[f32]) {
    let d = acc.len();
    assert!(vb.len() >= e.len() * d);
    #[cfg(target_arch = "x86_64")]
    if FMA && d.is_multiple_of(32) {
        // SAFETY: as in `block_scores`; lengths asserted above.
        unsafe { fma::add_values(acc, corr, e, vb) };
        return;
    }
    if corr != 1.0 {
        acc.iter_mut().for_each(|x| *x *= corr);
    }
    for (&ej, vrow) in e.iter().zip(vb.chunks_exact(d)) {
        for (x, &v) in acc.iter_mut().zip(vrow) {
            *x = vecmath::madd::<FMA>(ej, v, *x);
        }
    }
}

/// The AVX2 + FMA bodies of [`block_scores`] and [`add_values`], inlined
/// into `Task::attend`'s `run_fma`.
#[cfg(target_arch = "x86_64")]
mod fma {
    use std::arch::x86_64::*;

    use super::BLOCK_SIZE;

    /// # Safety
    /// AVX2 + FMA; `kt` is `[d, 16]`, `out` holds `qs.len() / d` rows of 16.
    #[inline(always)]
    pub(super) unsafe fn block_scores(qs: &[f32], kt: &[f32], d: usize, out: &mut [f32]) {
        let n = qs.len() / d;
        let (q, kt, out) = (qs.as_ptr(), kt.as_ptr(), out.as_mut_ptr());
        let mut i = 0;
        while i < n {
            let (q, out) = (q.add(i * d), out.add(i * BLOCK_SIZE));
            i += match n - i {
                4.. => tile::<4>(q, kt, d, out),
                3 => tile::<3>(q, kt, d, out),
                2 => tile::<2>(q, kt, d, out),
                _ => tile::<1>(q, kt, d, out),
            };
        }
    }

    /// `Q` queries against the 16 keys: two 8-lane accumulators each, the
    /// transposed keys' row `c` loaded once for all `Q`. Returns `Q`.
    #[inline(always)]
    unsafe fn tile<const Q: usize>(
        q: *const f32,
        kt: *const f32,
        d: usize,
        out: *mut f32,
    ) -> usize {
        let mut s = [[_mm256_setzero_ps(); 2]; Q];
        for c in 0..d {
            let k0 = _mm256_loadu_ps(kt.add(c * BLOCK_SIZE));
            let k1 = _mm256_loadu_ps(kt.add(c * BLOCK_SIZE + 8));
            for (i, s) in s.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*q.add(i * d + c));
                s[0] = _mm256_fmadd_ps(x, k0, s[0]);
                s[1] = _mm256_fmadd_ps(x, k1, s[1]);
            }
        }
        for (i, s) in s.iter().enumerate() {
            _mm256_storeu_ps(out.add(i * BLOCK_SIZE), s[0]);
            _mm256_storeu_ps(out.add(i * BLOCK_SIZE + 8), s[1]);
        }
        Q
    }

    /// # Safety
    /// AVX2 + FMA; `acc.len()` is a multiple of 32 and `vb` holds
    /// `e.len()` rows of `acc.len()`.
    #[inline(always)]
    pub(super) unsafe fn add_values(acc: &mut [f32], corr: f32, e: &[f32], vb: &[f32]) {
        let d = acc.len();
        let (a, v) = (acc.as_mut_ptr(), vb.as_ptr());
        let c = _mm256_set1_ps(corr);
        for c0 in (0..d).step_by(32) {
            let mut r: [__m256; 4] =
                std::array::from_fn(|k| _mm256_mul_ps(c, _mm256_loadu_ps(a.add(c0 + 8 * k))));
            for (j, &ej) in e.iter().enumerate() {
                let w = _mm256_set1_ps(ej);
                for (k, r) in r.iter_mut().enumerate() {
                    *r = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(j * d + c0 + 8 * k)), *r);
                }
            }
            for (k, r) in r.iter().enumerate() {
                _mm256_storeu_ps(a.add(c0 + 8 * k), *r);
            }
        }
    }
}
