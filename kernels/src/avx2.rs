//! AVX2 + FMA kernels.
//!
//! A 32-value block pair is one 256-bit register each: the weights (4-bit
//! values widened to bytes: low nibbles then high nibbles, which is value
//! order), the activations (32 signed bytes). `vpmaddubsw` multiplies
//! unsigned weight bytes by signed activation bytes and adds adjacent pairs
//! into i16 (no saturation: `2 * 15 * 127` or `2 * 128 * 127` fit), then
//! `vpmaddwd` with ones adds pairs into 8 i32 lanes; lane `l` holds values
//! `4l..4l + 4`, so lanes 0..4 are the first 16 values and 4..8 the last 16.
//! The lanes go to f32 and are multiplied by the block's scales and added
//! into an f32 accumulator with one FMA. Signed weights (the I8 layout) use
//! `|w|` and `x` with the sign of `w` (`vpsignb`), as `vpmaddubsw` wants an
//! unsigned first operand.
//!
//! The offsets' share, `sum_b m_b s_b`, is a separate f32 dot product per
//! (weight row, activation row) after the block loop.

use std::arch::x86_64::*;

use crate::act::Acts;
use crate::formats::{I8, U4};
use crate::Tile;

pub(crate) struct U4Tile<'a> {
    w: &'a U4,
    acts: &'a Acts,
}

pub(crate) struct I8Tile<'a> {
    w: &'a I8,
    acts: &'a Acts,
}

impl<'a> U4Tile<'a> {
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    pub(crate) unsafe fn new(w: &'a U4, acts: &'a Acts) -> Self {
        Self { w, acts }
    }
}

impl<'a> I8Tile<'a> {
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    pub(crate) unsafe fn new(w: &'a I8, acts: &'a Acts) -> Self {
        Self { w, acts }
    }
}

/// Sum of the 8 lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
}

/// `sum_b m[b] * s[b]` in four independent partial sums.
#[inline(always)]
pub(crate) fn dot_mins(m: &[f32], s: &[f32]) -> f32 {
    let mut p = [0f32; 4];
    let (mc, sc) = (m.chunks_exact(4), s.chunks_exact(4));
    let tail: f32 = mc
        .remainder()
        .iter()
        .zip(sc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in mc.zip(sc) {
        for l in 0..4 {
            p[l] += a[l] * b[l];
        }
    }
    (p[0] + p[1]) + (p[2] + p[3]) + tail
}

/// The U4 tile (see the module docs).
///
/// # Safety
/// AVX2 and FMA; rows `r..r + R` of `w` and `a..a + A` of `acts` exist
/// (asserted).
#[target_feature(enable = "avx2,fma")]
unsafe fn u4_tile<const R: usize, const A: usize>(
    w: &U4,
    acts: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    let nb = w.nb;
    assert!(acts.nb == nb && (r + R) * nb <= w.qs.len() && (a + A) * nb <= acts.qs.len());
    let (wq, wd) = (w.qs.as_ptr().add(r * nb), w.d.as_ptr().add(r * nb));
    let (aq, ad) = (acts.qs.as_ptr().add(a * nb), acts.d.as_ptr().add(a * nb));
    let low4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); A]; R];
    for b in 0..nb {
        for (i, acc) in acc.iter_mut().enumerate() {
            let raw = _mm_loadu_si128(wq.add(i * nb + b) as *const __m128i);
            let wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
            let dw = _mm256_set1_ps(*wd.add(i * nb + b));
            for (j, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_loadu_si256(aq.add(j * nb + b) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.add(j * nb + b)));
                *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), *acc);
            }
        }
    }
    let mut out = [[0f32; A]; R];
    for i in 0..R {
        let wm = &w.m[(r + i) * nb..(r + i + 1) * nb];
        for j in 0..A {
            let s = &acts.s[(a + j) * nb..(a + j + 1) * nb];
            out[i][j] = hsum(acc[i][j]) + dot_mins(wm, s);
        }
    }
    out
}

/// The I8 tile (see the module docs).
///
/// # Safety
/// As [`u4_tile`].
#[target_feature(enable = "avx2,fma")]
unsafe fn i8_tile<const R: usize, const A: usize>(
    w: &I8,
    acts: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    let nb = w.nb;
    assert!(acts.nb == nb && (r + R) * nb <= w.qs.len() && (a + A) * nb <= acts.qs.len());
    let (wq, wd) = (w.qs.as_ptr().add(r * nb), w.d.as_ptr().add(r * nb));
    let (aq, ad) = (acts.qs.as_ptr().add(a * nb), acts.d.as_ptr().add(a * nb));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); A]; R];
    for b in 0..nb {
        for (i, acc) in acc.iter_mut().enumerate() {
            let wv = _mm256_loadu_si256(wq.add(i * nb + b) as *const __m256i);
            let wabs = _mm256_abs_epi8(wv);
            let sc = _mm256_set1_ps(*wd.add(i * nb + b));
            for (j, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_loadu_si256(aq.add(j * nb + b) as *const __m256i);
                let signed = _mm256_sign_epi8(av, wv);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, signed), ones);
                let scale = _mm256_mul_ps(sc, _mm256_set1_ps(*ad.add(j * nb + b)));
                *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), *acc);
            }
        }
    }
    let mut out = [[0f32; A]; R];
    for i in 0..R {
        for j in 0..A {
            out[i][j] = hsum(acc[i][j]);
            if let Some(m) = &w.m {
                let wm = &m[(r + i) * nb..(r + i + 1) * nb];
                out[i][j] += dot_mins(wm, &acts.s[(a + j) * nb..(a + j + 1) * nb]);
            }
        }
    }
    out
}

impl Tile for U4Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        // SAFETY: `new`'s contract (AVX2 + FMA); bounds asserted inside.
        unsafe { u4_tile::<R, A>(self.w, self.acts, r, a) }
    }
}

impl Tile for I8Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        // SAFETY: as for `U4Tile`.
        unsafe { i8_tile::<R, A>(self.w, self.acts, r, a) }
    }
}
