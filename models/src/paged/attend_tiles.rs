//! Prompt attention's scores and online-softmax step with the queries in
//! the lanes of 512-bit registers (AVX-512 F): 16 queries against a block
//! of 16 keys are 16 registers, one per key, so the maximum and the sum
//! over the keys are vertical operations instead of a reduction per query,
//! and the exponential of each query's maximum change is one [`exp16`] for
//! 16 queries instead of a scalar one each. Every query gets the
//! operations of `attend_wide.rs`'s per-query loop in the same order, so
//! the same bits.

use std::arch::x86_64::*;

use super::attend::Task;
use super::attend_wide::exp16;
use super::BLOCK_SIZE;

/// Queries per register in [`Tile::softmax`].
pub(super) const LANES: usize = 16;

/// The queries (`[n, d]`) transposed by tiles of [`LANES`]: tile `t`'s
/// dimension `c` at `[(t d + c) LANES..][..LANES]`, zero past the last.
pub(super) fn transpose_queries(qs: &[f32], d: usize) -> Vec<f32> {
    let n = qs.len() / d;
    let mut qt = vec![0f32; n.next_multiple_of(LANES) * d];
    // Written in order, read across the rows: scattered stores cost more
    // than scattered loads.
    for (tile, rows) in qt.chunks_exact_mut(LANES * d).zip(qs.chunks(LANES * d)) {
        for (c, out) in tile.chunks_exact_mut(LANES).enumerate() {
            for (o, &x) in out.iter_mut().zip(rows[c..].iter().step_by(d)) {
                *o = x;
            }
        }
    }
    qt
}

/// Where query `qi`'s probability of a block's first key is in
/// [`Online::probs`] (key `j`'s `j * LANES` further on).
pub(super) fn tile_prob_at(qi: usize) -> usize {
    (qi / LANES) * LANES * BLOCK_SIZE + qi % LANES
}

/// A prompt task's online softmax, query by query: running maximum `m`,
/// sum `l`, the last block's correction `corr`, and the block's
/// probabilities (`probs`, tile by tile, as [`tile_prob_at`] says).
pub(super) struct Online<'a> {
    pub(super) m: &'a mut [f32],
    pub(super) l: &'a mut [f32],
    pub(super) corr: &'a mut [f32],
    pub(super) probs: &'a mut [f32],
}

impl Task<'_> {
    /// The online-softmax step of queries `first..` (those that see the
    /// block starting at position `base`) against the block's keys (`kt`,
    /// transposed, `[d, 16]`), [`LANES`] queries at a time from the
    /// transposed queries `qt` ([`transpose_queries`]).
    ///
    /// # Safety
    /// AVX-512 F; `kt` holds a block's keys, `qt` the task's queries.
    #[inline(always)]
    pub(super) unsafe fn softmax_tiles(
        &self,
        qt: &[f32],
        kt: &[f32],
        base: usize,
        first: usize,
        online: Online<'_>,
    ) {
        let (d, nq) = (self.pool.head_dim, online.m.len());
        let n_rep = self.shape.num_heads / self.pool.num_kv_heads;
        for t in first / LANES..nq.div_ceil(LANES) {
            let valid = std::array::from_fn(|i| {
                let qi = t * LANES + i;
                if (first..nq).contains(&qi) {
                    self.visible(qi, base, n_rep) as i32
                } else {
                    0
                }
            });
            let tile = Tile {
                qt: &qt[t * d * LANES..(t + 1) * d * LANES],
                valid,
                at: t * LANES,
            };
            let probs = &mut online.probs[t * LANES * BLOCK_SIZE..(t + 1) * LANES * BLOCK_SIZE];
            tile.softmax(kt, d, online.m, online.l, online.corr, probs);
        }
    }
}

/// [`LANES`] queries from `at` (transposed, `qt`, `[d, 16]`), of which
/// query `at + i` sees the first `valid[i]` keys of the block (none: left
/// as it is).
struct Tile<'a> {
    qt: &'a [f32],
    valid: [i32; LANES],
    at: usize,
}

impl Tile<'_> {
    /// The online-softmax step of every query of the tile against one
    /// block's keys (`kt`, transposed, `[d, 16]`), with the queries in the
    /// lanes: key `j`'s scores are one register, the maximum and the sum
    /// over the keys are vertical operations, and the exponential of each
    /// maximum's change is one [`exp16`] for the 16 queries. Each query
    /// gets the per-query loop's operations in the same order (the same
    /// chains of fused multiply-adds for the scores, the sum in
    /// [`sum16`]'s order), so the same bits. Updates `m`, `l` and `corr`
    /// of the seen queries and writes their probabilities key by key
    /// (`probs[j * 16 + i]`).
    ///
    /// # Safety
    /// AVX-512 F; `kt` has `d * 16` values, `qt` `d * 16`, `probs` 256.
    #[inline(always)]
    unsafe fn softmax(
        &self,
        kt: &[f32],
        d: usize,
        m: &mut [f32],
        l: &mut [f32],
        corr: &mut [f32],
        probs: &mut [f32],
    ) {
        assert!(kt.len() >= d * BLOCK_SIZE && self.qt.len() >= d * LANES);
        assert!(probs.len() >= LANES * BLOCK_SIZE && self.at < m.len());
        assert!(m.len() == l.len() && m.len() == corr.len());
        let (qt, kt) = (self.qt.as_ptr(), kt.as_ptr());
        let mut s = [_mm512_setzero_ps(); BLOCK_SIZE];
        for c in 0..d {
            let q = _mm512_loadu_ps(qt.add(c * LANES));
            for (j, s) in s.iter_mut().enumerate() {
                *s = _mm512_fmadd_ps(q, _mm512_set1_ps(*kt.add(c * BLOCK_SIZE + j)), *s);
            }
        }
        let valid = _mm512_loadu_si512(self.valid.as_ptr().cast());
        // Lanes of queries that do not see the block (or past the task's
        // last) are never read or written.
        let seen = _mm512_cmpgt_epi32_mask(valid, _mm512_setzero_si512());
        let keep: [__mmask16; BLOCK_SIZE] =
            std::array::from_fn(|j| _mm512_cmpgt_epi32_mask(valid, _mm512_set1_epi32(j as i32)));
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for (s, &k) in s.iter().zip(&keep) {
            mx = _mm512_mask_max_ps(mx, k, mx, *s);
        }
        let (mp, lp, cp) = (
            m.as_mut_ptr().add(self.at),
            l.as_mut_ptr().add(self.at),
            corr.as_mut_ptr().add(self.at),
        );
        let old_m = _mm512_maskz_loadu_ps(seen, mp);
        let new_m = _mm512_max_ps(old_m, mx);
        let c = exp16(_mm512_sub_ps(old_m, new_m));
        for (s, &k) in s.iter_mut().zip(&keep) {
            *s = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(*s, new_m)));
        }
        // `sum16`'s order: keys j and j + 8, then + 4, + 2, + 1.
        let h: [__m512; 8] = std::array::from_fn(|j| _mm512_add_ps(s[j], s[j + 8]));
        let q: [__m512; 4] = std::array::from_fn(|j| _mm512_add_ps(h[j], h[j + 4]));
        let r = [_mm512_add_ps(q[0], q[2]), _mm512_add_ps(q[1], q[3])];
        let sum = _mm512_add_ps(r[0], r[1]);
        let old_l = _mm512_maskz_loadu_ps(seen, lp);
        _mm512_mask_storeu_ps(lp, seen, _mm512_add_ps(_mm512_mul_ps(old_l, c), sum));
        _mm512_mask_storeu_ps(mp, seen, new_m);
        _mm512_mask_storeu_ps(cp, seen, c);
        for (j, s) in s.iter().enumerate() {
            _mm512_storeu_ps(probs.as_mut_ptr().add(j * LANES), *s);
        }
    }
}
