//! A task's attention on 512-bit registers (AVX-512 F), for CPUs that
//! have them: the same operations as the AVX2 body in `attend.rs`, lane for
//! lane and in the same order (so the same bits), arranged so that more of
//! them share each load.
//!
//! - **Scores**: a query's 16 scores against a block are one register, and
//!   a tile of up to 8 queries shares each row of the transposed keys.
//! - **Softmax**: the 16 exponentials at once (the polynomial of
//!   [`vecmath::exp`], operation for operation), the invisible keys masked.
//! - **Prompt tasks** (more than 8 queries): scores and softmax with 16
//!   queries in the lanes instead of 16 keys (`attend_tiles.rs`): the
//!   maximum and the sum over a block's keys are vertical operations, and
//!   the exponential of each maximum's change one for 16 queries; prompt
//!   attention (64 rows after 512) about 1.2x faster.
//! - **Values**: up to 4 queries that see the same keys (the heads of one
//!   row, or rows past the diagonal block) share each loaded value row: 4
//!   queries x 64 dimensions are 16 accumulators.
//! - **Decode** (at most 8 queries, one score tile): an f16 pool's keys and
//!   values are widened as they are loaded (`vcvtph2ps`, exact), without
//!   converting each block into scratch first; with more queries each block
//!   is converted once and read by every tile.

use std::arch::x86_64::*;

use super::attend::{normalize, State, Task};
use super::attend_tiles::{tile_prob_at, transpose_queries, Online, LANES};
use super::BLOCK_SIZE;
use crate::vecmath;

/// Whether this CPU runs the 512-bit body for heads of `head_dim`.
pub(super) fn available(head_dim: usize) -> bool {
    head_dim.is_multiple_of(16) && vecmath::has_fma() && std::is_x86_feature_detected!("avx512f")
}

impl Task<'_> {
    /// `Task::attend` on 512-bit registers.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F; `head_dim` a multiple of 16.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn run_wide(&self) -> Vec<f32> {
        let Task {
            pool,
            layer,
            seq,
            g,
            r1,
            ..
        } = *self;
        let d = pool.head_dim;
        assert!(d.is_multiple_of(16));
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
        let mut corr = vec![0f32; nq];
        let last = seq.pos + r1 - 1;
        let direct = nq <= 8;
        // More queries than a decode task's: scores and softmax 16 queries
        // to a register (`Task::softmax_tiles`), the probabilities stored
        // key by key.
        let tiles = !direct;
        let qt = if tiles {
            transpose_queries(&qs, d)
        } else {
            Vec::new()
        };
        let mut probs = vec![0f32; nq.next_multiple_of(LANES) * BLOCK_SIZE];
        let (q_stride, k_stride) = if tiles { (1, LANES) } else { (BLOCK_SIZE, 1) };
        // With f16 read directly: the scores of the next `AHEAD` blocks.
        let mut ahead = vec![0f32; if direct { AHEAD * nq * BLOCK_SIZE } else { 0 }];
        let mut ahead_blocks = 0..0;
        for b in 0..=last / BLOCK_SIZE {
            let block = seq.blocks[b];
            let half = match (
                direct,
                pool.block_f16(layer, false, block, g),
                pool.block_f16(layer, true, block, g),
            ) {
                (true, Some(k), Some(v)) => Some((Half(k.as_ptr()), Half(v.as_ptr()))),
                _ => {
                    pool.read_block(layer, false, block, g, &mut kt);
                    pool.read_block(layer, true, block, g, &mut vb);
                    None
                }
            };
            self.prefetch_ahead(b);
            let base = b * BLOCK_SIZE;
            let first = self.first_query(base, n_rep, nq);
            if tiles {
                let online = Online {
                    m: &mut m,
                    l: &mut l,
                    corr: &mut corr,
                    probs: &mut probs,
                };
                self.softmax_tiles(&qt, &kt, base, first, online);
            } else {
                let sc: &[f32] = match half {
                    Some((k, _)) => {
                        if !ahead_blocks.contains(&b) {
                            // This block and up to 3 more: 4 blocks' chains
                            // of fused multiply-adds run side by side.
                            let n = (last / BLOCK_SIZE + 1 - b).min(AHEAD);
                            let keys: [Half; AHEAD] = std::array::from_fn(|i| {
                                let more = (i < n)
                                    .then(|| pool.block_f16(layer, false, seq.blocks[b + i], g))
                                    .flatten();
                                more.map_or(k, |h| Half(h.as_ptr()))
                            });
                            scores_ahead(&qs, keys, d, &mut ahead);
                            ahead_blocks = b..b + n;
                        }
                        &ahead[(b - ahead_blocks.start) * nq * BLOCK_SIZE..]
                    }
                    None => {
                        let s_out = &mut scores[first * BLOCK_SIZE..];
                        block_scores(&qs[first * d..], &kt, d, s_out);
                        &scores
                    }
                };
                for qi in first..nq {
                    let valid = self.visible(qi, base, n_rep);
                    let row = qi * BLOCK_SIZE..(qi + 1) * BLOCK_SIZE;
                    let s = _mm512_loadu_ps(sc[row.clone()].as_ptr());
                    let keep = ((1u32 << valid) - 1) as __mmask16;
                    let mx = _mm512_mask_reduce_max_ps(keep, s);
                    let new_m = m[qi].max(mx);
                    corr[qi] = vecmath::exp(m[qi] - new_m);
                    let e =
                        _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(s, _mm512_set1_ps(new_m))));
                    l[qi] = l[qi] * corr[qi] + sum16(e);
                    _mm512_storeu_ps(probs[row].as_mut_ptr(), e);
                    m[qi] = new_m;
                }
            }
            // Runs of up to 4 queries that see the same keys.
            let mut qi = first;
            while qi < nq {
                let valid = self.visible(qi, base, n_rep);
                let mut end = qi + 1;
                // With tiles, a run stays in one (its queries' probabilities
                // are neighbours).
                while end < nq
                    && end - qi < 4
                    && !(tiles && end.is_multiple_of(LANES))
                    && self.visible(end, base, n_rep) == valid
                {
                    end += 1;
                }
                let (acc, corr) = (acc[qi * d..end * d].as_mut_ptr(), &corr[qi..end]);
                let probs = if tiles {
                    probs[tile_prob_at(qi)..].as_ptr()
                } else {
                    probs[qi * BLOCK_SIZE..].as_ptr()
                };
                match half {
                    Some((_, v)) => Run {
                        acc,
                        corr,
                        probs,
                        q_stride,
                        k_stride,
                        valid,
                        vb: v,
                        d,
                    }
                    .add(end - qi),
                    None => Run {
                        acc,
                        corr,
                        probs,
                        q_stride,
                        k_stride,
                        valid,
                        vb: vb.as_ptr(),
                        d,
                    }
                    .add(end - qi),
                }
                qi = end;
            }
        }
        normalize(&mut acc, &l);
        acc
    }
}

/// [`super::attend::sum16`] on a register: its 256-bit halves added, then
/// the 128-bit halves, then lanes 2 and 3 onto 0 and 1, then lane 1 onto 0.
#[inline(always)]
unsafe fn sum16(e: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(e), hi);
    let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let r = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps::<1>(r, r)))
}

/// `e^x` on 16 lanes: [`vecmath::exp`]'s operations (unfused multiplies
/// and adds, the same constants, in the same order), so the same bits for
/// finite `x`.
#[inline(always)]
pub(super) unsafe fn exp16(x: __m512) -> __m512 {
    use vecmath::exp_consts::*;
    let set = _mm512_set1_ps;
    let madd = |a: __m512, b: __m512, c: __m512| _mm512_add_ps(_mm512_mul_ps(a, b), c);
    let x = _mm512_min_ps(_mm512_max_ps(x, set(-87.0)), set(88.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(madd(
        x,
        set(LOG2E),
        set(0.5),
    ));
    let neg_n = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(n),
        _mm512_set1_epi32(i32::MIN),
    ));
    let r = madd(neg_n, set(C2), madd(neg_n, set(C1), x));
    let mut p = set(P0);
    for c in P {
        p = madd(p, r, set(c));
    }
    let e_r = _mm512_add_ps(madd(_mm512_mul_ps(p, r), r, r), set(1.0));
    let two_n = _mm512_slli_epi32::<23>(_mm512_castps_si512(_mm512_add_ps(n, set(127.0 + MAGIC))));
    _mm512_mul_ps(e_r, _mm512_castsi512_ps(two_n))
}

/// A block's keys (transposed, `[d, 16]`) or values (`[16, d]`): f32
/// scratch, or the pool's f16 bits ([`Half`]).
trait Rows: Copy {
    /// The 16 values from element `at` on, as f32.
    unsafe fn load16(self, at: usize) -> __m512;
}

impl Rows for *const f32 {
    #[inline(always)]
    unsafe fn load16(self, at: usize) -> __m512 {
        _mm512_loadu_ps(self.add(at))
    }
}

/// f16 bits, widened as they are loaded (exactly, as the scratch's
/// conversion does).
#[derive(Clone, Copy)]
struct Half(*const u16);

impl Rows for Half {
    #[inline(always)]
    unsafe fn load16(self, at: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(self.0.add(at).cast()))
    }
}

/// `out[i * 16 + j] = q_i . key_j` for the queries `qs` (`[n, d]`) and one
/// block's keys transposed (`kt`, `[d, 16]`), in tiles of up to 8 queries.
#[inline(always)]
unsafe fn block_scores(qs: &[f32], kt: &[f32], d: usize, out: &mut [f32]) {
    let n = qs.len() / d;
    assert!(kt.len() == d * BLOCK_SIZE && out.len() >= n * BLOCK_SIZE);
    let (q, kt, out) = (qs.as_ptr(), kt.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < n {
        let (q, out) = (q.add(i * d), out.add(i * BLOCK_SIZE));
        i += match n - i {
            8.. => scores_tile::<8>(q, kt, d, out),
            4.. => scores_tile::<4>(q, kt, d, out),
            2.. => scores_tile::<2>(q, kt, d, out),
            _ => scores_tile::<1>(q, kt, d, out),
        };
    }
}

/// Key blocks whose scores a decode task computes together.
const AHEAD: usize = 4;

/// The scores of every query of `qs` (at most 8, rows of `d`) against the
/// keys of `AHEAD` blocks: block `i`'s at `out[i * nq * 16..]`, as
/// [`block_scores`] lays them out. Each score is the same chain of fused
/// multiply-adds as there; 4 blocks x up to 4 queries are 16 independent
/// chains, where one block of a decode task's few queries is latency bound.
#[inline(always)]
unsafe fn scores_ahead(qs: &[f32], keys: [Half; AHEAD], d: usize, out: &mut [f32]) {
    let nq = qs.len() / d;
    assert!(nq <= 8 && out.len() >= AHEAD * nq * BLOCK_SIZE);
    let stride = nq * BLOCK_SIZE;
    let mut i = 0;
    while i < nq {
        let (q, o) = (qs.as_ptr().add(i * d), out.as_mut_ptr().add(i * BLOCK_SIZE));
        i += match nq - i {
            4.. => ahead_tile::<4>(q, keys, d, o, stride),
            3 => ahead_tile::<3>(q, keys, d, o, stride),
            2 => ahead_tile::<2>(q, keys, d, o, stride),
            _ => ahead_tile::<1>(q, keys, d, o, stride),
        };
    }
}

/// `Q` queries against the keys of [`AHEAD`] blocks (block `i`'s scores at
/// `out + i * stride`). Returns `Q`.
#[inline(always)]
unsafe fn ahead_tile<const Q: usize>(
    q: *const f32,
    keys: [Half; AHEAD],
    d: usize,
    out: *mut f32,
    stride: usize,
) -> usize {
    let mut s = [[_mm512_setzero_ps(); Q]; AHEAD];
    for c in 0..d {
        let qv: [__m512; Q] = std::array::from_fn(|i| _mm512_set1_ps(*q.add(i * d + c)));
        for (s, kt) in s.iter_mut().zip(keys) {
            let k = kt.load16(c * BLOCK_SIZE);
            for (s, &x) in s.iter_mut().zip(&qv) {
                *s = _mm512_fmadd_ps(x, k, *s);
            }
        }
    }
    for (b, s) in s.iter().enumerate() {
        for (i, s) in s.iter().enumerate() {
            _mm512_storeu_ps(out.add(b * stride + i * BLOCK_SIZE), *s);
        }
    }
    Q
}

/// `Q` queries against the 16 keys, one accumulator each. Returns `Q`.
#[inline(always)]
unsafe fn scores_tile<const Q: usize>(
    q: *const f32,
    kt: *const f32,
    d: usize,
    out: *mut f32,
) -> usize {
    let mut s = [_mm512_setzero_ps(); Q];
    for c in 0..d {
        let k = _mm512_loadu_ps(kt.add(c * BLOCK_SIZE));
        for (i, s) in s.iter_mut().enumerate() {
            *s = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(i * d + c)), k, *s);
        }
    }
    for (i, s) in s.iter().enumerate() {
        _mm512_storeu_ps(out.add(i * BLOCK_SIZE), *s);
    }
    Q
}

/// Consecutive queries that see the first `valid` keys of a block: their
/// accumulators (`acc`, rows of `d`), rescaled by `corr` and added the
/// probabilities (query `i`'s of key `j` at `probs + i q_stride + j
/// k_stride`) times the value rows (`vb`, `[16, d]`).
struct Run<'a, V> {
    acc: *mut f32,
    corr: &'a [f32],
    probs: *const f32,
    q_stride: usize,
    k_stride: usize,
    valid: usize,
    vb: V,
    d: usize,
}

impl<V: Rows> Run<'_, V> {
    /// For `queries` (1 to 4) queries.
    #[inline(always)]
    unsafe fn add(&self, queries: usize) {
        match queries {
            4 => self.add_queries::<4>(),
            3 => self.add_queries::<3>(),
            2 => self.add_queries::<2>(),
            _ => self.add_queries::<1>(),
        }
    }

    /// For `Q` queries: 64 dimensions at a time (16 accumulators), then 16.
    #[inline(always)]
    unsafe fn add_queries<const Q: usize>(&self) {
        let mut c0 = 0;
        while c0 + 64 <= self.d {
            self.add_columns::<Q, 4>(c0);
            c0 += 64;
        }
        while c0 < self.d {
            self.add_columns::<Q, 1>(c0);
            c0 += 16;
        }
    }

    /// Dimensions `c0..c0 + 16 R` of `Q` queries: `acc = acc * corr + sum_j
    /// p_j v_j`, `j` in order.
    #[inline(always)]
    unsafe fn add_columns<const Q: usize, const R: usize>(&self, c0: usize) {
        let (a, d) = (self.acc, self.d);
        let mut r: [[__m512; R]; Q] = std::array::from_fn(|i| {
            let c = _mm512_set1_ps(self.corr[i]);
            std::array::from_fn(|k| _mm512_mul_ps(c, _mm512_loadu_ps(a.add(i * d + c0 + 16 * k))))
        });
        for j in 0..self.valid {
            let v: [__m512; R] = std::array::from_fn(|k| self.vb.load16(j * d + c0 + 16 * k));
            for (i, r) in r.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*self.probs.add(i * self.q_stride + j * self.k_stride));
                for (r, &v) in r.iter_mut().zip(&v) {
                    *r = _mm512_fmadd_ps(w, v, *r);
                }
            }
        }
        for (i, r) in r.iter().enumerate() {
            for (k, r) in r.iter().enumerate() {
                _mm512_storeu_ps(a.add(i * d + c0 + 16 * k), *r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::super::{AttnShape, KvPool, SeqView};
    use super::*;

    /// Deterministic values in about -2..2.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 4001) as f32 / 1000.0 - 2.0
            })
            .collect()
    }

    /// Every task of a chunk (rows crossing blocks, a diagonal block partly
    /// visible, and a decode row; the prompt tasks through `attend_tiles.rs`,
    /// first and last tiles partly used) gives the same bits as the AVX2
    /// body, for
    /// head sizes with and without a 64-wide part and for 1, 3 and 4 query
    /// heads per KV head.
    #[test]
    fn wide_attention_equals_avx2_bit_for_bit() {
        if !available(64) {
            eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        let blocks: Vec<u32> = vec![5, 1, 7, 3, 0, 6, 2, 4];
        for (d, n_rep, dtype) in [
            (64, 3, DType::F16),
            (64, 4, DType::F32),
            (128, 1, DType::BF16),
            (80, 4, DType::F16),
            (16, 3, DType::F32),
        ] {
            let nkv = 2;
            let nh = nkv * n_rep;
            for (pos, len) in [(0, 45), (21, 40), (70, 1), (16, 16)] {
                let mut pool = KvPool::new(1, nkv, d, blocks.len(), dtype).unwrap();
                let total = pos + len;
                let view = SeqView {
                    blocks: &blocks,
                    pos: 0,
                    offset: 0,
                    len: total,
                };
                let k = values(nkv * total * d, 1 + d as u64);
                let v = values(nkv * total * d, 2 + pos as u64);
                pool.write(0, &view, &k, &v, total);
                let q = values(nh * len * d, 3 + len as u64);
                let seq = SeqView {
                    blocks: &blocks,
                    pos,
                    offset: 0,
                    len,
                };
                let shape = AttnShape {
                    num_heads: nh,
                    tokens: len,
                };
                for g in 0..nkv {
                    for r0 in (0..len).step_by(32) {
                        let task = Task {
                            pool: &pool,
                            layer: 0,
                            q: &q,
                            shape,
                            seq: &seq,
                            g,
                            r0,
                            r1: (r0 + 32).min(len),
                            next: None,
                        };
                        let (wide, narrow) = (task.attend_with(true), task.attend_with(false));
                        let same = wide
                            .iter()
                            .zip(&narrow)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same && wide.len() == narrow.len(),
                            "d={d} n_rep={n_rep} {dtype:?} pos={pos} len={len} g={g} r0={r0}"
                        );
                    }
                }
            }
        }
    }
}
