//! Q4_K and Q6_K with integer sums over whole 256-value super-blocks.
//!
//! The K-quants give each 32 (Q4_K) or 16 (Q6_K) values a small integer
//! scale under one f16 super-block scale. With the activations quantized
//! per 256 values too (one f32 `d_x` per super-block, as llama.cpp's Q8_K;
//! see `act.rs`), a super-block's dot product is integer up to one final
//! multiplication:
//!
//! - Q4_K: `w = d sc_s q - dmin mn_s` (`q` 4-bit, `sc`, `mn` 6-bit), so
//!   `sum w x = d d_x sum_s sc_s sum_{j in s} q_j qx_j - dmin d_x sum_s mn_s
//!   bsum_s`, with `bsum_s` the integer sum of the activation quants of
//!   sub-block `s`;
//! - Q6_K: `w = d sc_g (q - 32)` (`sc` signed 8-bit per 16 values), so
//!   `sum w x = d d_x sum_g sc_g sum_{j in g} (q_j - 32) qx_j`.
//!
//! The inner sums fit i32: at most `2 * 15 * 127 * 63 * 2` per lane and
//! sub-block for Q4_K, `2 * 32 * 127 * 127 * 2` for Q6_K, times 8 sub-blocks.
//! AVX2 does each sub-block with `vpmaddubsw` and a `vpmaddwd` by the
//! sub-block's scales (instead of ones), adding into i32 lanes; the f32 work
//! is once per super-block.

use std::ops::Range;

use crate::act::Acts;
use crate::formats::{Nib, Q8, QK};

/// Q4_K rows: super-block `t` of row `r` at `r * ns + t`; its 8 sub-blocks'
/// nibbles at `8 (r * ns + t)..` in the 32-value nibble order of `Nib`.
#[derive(Debug)]
pub(crate) struct K4 {
    pub ns: usize,
    pub qs: Vec<Nib>,
    pub sc: Vec<[i16; 8]>,
    pub mn: Vec<[i32; 8]>,
    pub d: Vec<f32>,
    pub dmin: Vec<f32>,
}

/// Q6_K rows, laid out as [`K4`]; values `q - 32`, one scale per 16.
#[derive(Debug)]
pub(crate) struct K6 {
    pub ns: usize,
    pub qs: Vec<Q8>,
    pub sc: Vec<[i16; 16]>,
    pub d: Vec<f32>,
}

impl K4 {
    /// Appends rows `rows` as f32.
    pub(crate) fn dequantize_rows(&self, rows: Range<usize>, out: &mut Vec<f32>) {
        for t in rows.start * self.ns..rows.end * self.ns {
            let (d, dmin) = (self.d[t], self.dmin[t]);
            for s in 0..8 {
                let ds = d * self.sc[t][s] as f32;
                let ms = -(dmin * self.mn[t][s] as f32);
                let q = &self.qs[8 * t + s].0;
                out.extend(q.iter().map(|&v| ds * (v & 0xF) as f32 + ms));
                out.extend(q.iter().map(|&v| ds * (v >> 4) as f32 + ms));
            }
        }
    }
}

impl K6 {
    /// Appends rows `rows` as f32.
    pub(crate) fn dequantize_rows(&self, rows: Range<usize>, out: &mut Vec<f32>) {
        for t in rows.start * self.ns..rows.end * self.ns {
            let d = self.d[t];
            for s in 0..8 {
                let q = &self.qs[8 * t + s].0;
                out.extend(
                    q.iter()
                        .enumerate()
                        .map(|(j, &v)| d * self.sc[t][2 * s + j / 16] as f32 * v as f32),
                );
            }
        }
    }
}

fn dot_k4(w: &K4, acts: &Acts, r: usize, a: usize) -> f32 {
    let ns = w.ns;
    let mut acc = 0f32;
    for t in 0..ns {
        let (wt, at) = (r * ns + t, a * ns + t);
        let (mut isum, mut imin) = (0i32, 0i32);
        for s in 0..8 {
            let (wq, aq) = (&w.qs[8 * wt + s].0, &acts.qs[8 * at + s].0);
            let mut p = 0i32;
            for j in 0..16 {
                p += (wq[j] & 0xF) as i32 * aq[j] as i32 + (wq[j] >> 4) as i32 * aq[j + 16] as i32;
            }
            isum += w.sc[wt][s] as i32 * p;
            imin += w.mn[wt][s] * acts.bsum[8 * at + s];
        }
        let dx = acts.d[at];
        acc += w.d[wt] * dx * isum as f32 - w.dmin[wt] * dx * imin as f32;
    }
    acc
}

fn dot_k6(w: &K6, acts: &Acts, r: usize, a: usize) -> f32 {
    let ns = w.ns;
    let mut acc = 0f32;
    for t in 0..ns {
        let (wt, at) = (r * ns + t, a * ns + t);
        let mut isum = 0i32;
        for s in 0..8 {
            let (wq, aq) = (&w.qs[8 * wt + s].0, &acts.qs[8 * at + s].0);
            let (mut lo, mut hi) = (0i32, 0i32);
            for j in 0..16 {
                lo += wq[j] as i32 * aq[j] as i32;
                hi += wq[j + 16] as i32 * aq[j + 16] as i32;
            }
            isum += w.sc[wt][2 * s] as i32 * lo + w.sc[wt][2 * s + 1] as i32 * hi;
        }
        acc += w.d[wt] * acts.d[at] * isum as f32;
    }
    acc
}

/// Portable tiles.
pub(crate) mod scalar {
    use super::*;
    use crate::Tile;

    pub(crate) struct K4Tile<'a> {
        pub w: &'a K4,
        pub acts: &'a Acts,
    }

    pub(crate) struct K6Tile<'a> {
        pub w: &'a K6,
        pub acts: &'a Acts,
    }

    impl Tile for K4Tile<'_> {
        fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
            std::array::from_fn(|i| {
                std::array::from_fn(|j| dot_k4(self.w, self.acts, r + i, a + j))
            })
        }
    }

    impl Tile for K6Tile<'_> {
        fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
            std::array::from_fn(|i| {
                std::array::from_fn(|j| dot_k6(self.w, self.acts, r + i, a + j))
            })
        }
    }
}

/// AVX2 + FMA tiles (see the module docs).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::Tile;

    pub(crate) struct K4Tile<'a> {
        w: &'a K4,
        acts: &'a Acts,
    }

    pub(crate) struct K6Tile<'a> {
        w: &'a K6,
        acts: &'a Acts,
    }

    impl<'a> K4Tile<'a> {
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        pub(crate) unsafe fn new(w: &'a K4, acts: &'a Acts) -> Self {
            Self { w, acts }
        }
    }

    impl<'a> K6Tile<'a> {
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        pub(crate) unsafe fn new(w: &'a K6, acts: &'a Acts) -> Self {
            Self { w, acts }
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
    }

    /// # Safety
    /// AVX2 and FMA; rows `r..r + R` of `w` and `a..a + A` of `acts`
    /// (asserted).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn k4_tile<const R: usize, const A: usize>(
        w: &K4,
        acts: &Acts,
        r: usize,
        a: usize,
    ) -> [[f32; A]; R] {
        let ns = w.ns;
        assert!(acts.nb == 8 * ns && (r + R) * ns <= w.d.len() && (a + A) * ns <= acts.d.len());
        assert!(acts.bsum.len() == acts.qs.len());
        let low4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); A]; R];
        for t in 0..ns {
            for (i, acc) in acc.iter_mut().enumerate() {
                let wt = (r + i) * ns + t;
                let wq = w.qs.as_ptr().add(8 * wt);
                let sc = w.sc.get_unchecked(wt);
                let mut iacc = [_mm256_setzero_si256(); A];
                for (s, &scale) in sc.iter().enumerate() {
                    let raw = _mm_loadu_si128(wq.add(s) as *const __m128i);
                    let wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
                    let scv = _mm256_set1_epi16(scale);
                    for (j, iacc) in iacc.iter_mut().enumerate() {
                        let at = (a + j) * ns + t;
                        let xv =
                            _mm256_loadu_si256(acts.qs.as_ptr().add(8 * at + s) as *const __m256i);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), scv);
                        *iacc = _mm256_add_epi32(*iacc, p);
                    }
                }
                let mn = _mm256_loadu_si256(w.mn.as_ptr().add(wt) as *const __m256i);
                let (d, dmin) = (*w.d.get_unchecked(wt), *w.dmin.get_unchecked(wt));
                for (j, acc) in acc.iter_mut().enumerate() {
                    let at = (a + j) * ns + t;
                    let dx = *acts.d.get_unchecked(at);
                    let bs = _mm256_loadu_si256(acts.bsum.as_ptr().add(8 * at) as *const __m256i);
                    let mins = _mm256_cvtepi32_ps(_mm256_mullo_epi32(mn, bs));
                    *acc =
                        _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(iacc[j]), *acc);
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(-(dmin * dx)), mins, *acc);
                }
            }
        }
        let mut out = [[0f32; A]; R];
        for i in 0..R {
            for j in 0..A {
                out[i][j] = hsum(acc[i][j]);
            }
        }
        out
    }

    /// # Safety
    /// As [`k4_tile`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn k6_tile<const R: usize, const A: usize>(
        w: &K6,
        acts: &Acts,
        r: usize,
        a: usize,
    ) -> [[f32; A]; R] {
        let ns = w.ns;
        assert!(acts.nb == 8 * ns && (r + R) * ns <= w.d.len() && (a + A) * ns <= acts.d.len());
        let mut acc = [[_mm256_setzero_ps(); A]; R];
        for t in 0..ns {
            for (i, acc) in acc.iter_mut().enumerate() {
                let wt = (r + i) * ns + t;
                let wq = w.qs.as_ptr().add(8 * wt);
                let sc = w.sc.get_unchecked(wt);
                let mut iacc = [_mm256_setzero_si256(); A];
                for s in 0..8 {
                    let wv = _mm256_loadu_si256(wq.add(s) as *const __m256i);
                    let wabs = _mm256_abs_epi8(wv);
                    // i16 lanes 0..8 hold values 0..16, lanes 8..16 values 16..32.
                    let scv =
                        _mm256_set_m128i(_mm_set1_epi16(sc[2 * s + 1]), _mm_set1_epi16(sc[2 * s]));
                    for (j, iacc) in iacc.iter_mut().enumerate() {
                        let at = (a + j) * ns + t;
                        let xv =
                            _mm256_loadu_si256(acts.qs.as_ptr().add(8 * at + s) as *const __m256i);
                        let p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv, wv));
                        *iacc = _mm256_add_epi32(*iacc, _mm256_madd_epi16(p, scv));
                    }
                }
                let d = *w.d.get_unchecked(wt);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let dx = *acts.d.get_unchecked((a + j) * ns + t);
                    *acc =
                        _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(iacc[j]), *acc);
                }
            }
        }
        let mut out = [[0f32; A]; R];
        for i in 0..R {
            for j in 0..A {
                out[i][j] = hsum(acc[i][j]);
            }
        }
        out
    }

    impl Tile for K4Tile<'_> {
        fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
            // SAFETY: `new`'s contract (AVX2 + FMA); bounds asserted inside.
            unsafe { k4_tile::<R, A>(self.w, self.acts, r, a) }
        }
    }

    impl Tile for K6Tile<'_> {
        fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
            // SAFETY: as for `K4Tile`.
            unsafe { k6_tile::<R, A>(self.w, self.acts, r, a) }
        }
    }
}

/// Values per super-block.
pub(crate) const QKK: usize = 256;
const _: () = assert!(QKK == 8 * QK);
