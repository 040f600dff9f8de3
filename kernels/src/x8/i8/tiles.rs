//! Ix8's 256-bit tiles without VNNI that take one register of values at a
//! time to every activation row: Q6_K over activations with one scale per
//! 256 values, and Q8_0 (see the parent module's docs).

use super::Ix8;
use crate::act::Acts;
use crate::formats::QK;
use crate::x8::scales::Scales;
#[cfg(target_arch = "x86_64")]
use crate::x8::simd::dpbusd;
#[cfg(target_arch = "x86_64")]
use crate::x8::NO_VNNI;
use crate::x8::{Group8, Half8, G, SPAN_BLOCKS};

/// Q6_K's kernels over activations with one scale per 256 values (only
/// called with `BITS == 6`).
impl<S: Scales, const BITS: u32> Ix8<S, BITS> {
    /// [`Group8::dot`] of Q6_K (`d`, `sc`: [`Scales::super_k6`]) over
    /// activations with one scale per 256 values: per super-block `S =
    /// sum_b sum_h sc_h sum_{j in h} q_j x_j` in integers, then `d d_x S`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dot_span256(
        &self,
        d: &[Half8],
        sc: &[[[i8; G]; 2]],
        acts: &Acts,
        g: usize,
        l: usize,
        a: usize,
    ) -> f32 {
        let nb = self.nb;
        let (mut acc, mut span) = (0f32, 0i32);
        for b in 0..nb {
            let (i, ai) = (g * nb + b, a * nb + b);
            let x = &acts.qs[ai].0;
            for (h, js) in [0..QK / 2, QK / 2..QK].into_iter().enumerate() {
                let isum: i32 = js.map(|j| self.q(i, l, j) * x[j] as i32).sum();
                span += sc[i][h][l] as i32 * isum;
            }
            if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                acc += d[i / G].get(l) * acts.d[ai] * span as f32;
                span = 0;
            }
        }
        acc
    }

    /// Register `v` of Q6_K's block `i` as the stored unsigned bytes `q +
    /// 32` ([`Ix8::load`]'s register `v` without the bias taken off).
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn value6(&self, i: usize, v: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        let low4 = _mm256_set1_epi8(0x0F);
        let top2 = _mm256_set1_epi8(0x30);
        let raw = _mm256_load_si256((self.lo.as_ptr().add(i) as *const __m256i).add(v % 4));
        let low = if v < 4 {
            _mm256_and_si256(raw, low4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4)
        };
        // As in `load`: bits `2 (v % 4)..` of the crumbs' bytes to bits 4
        // and 5.
        let c = _mm256_load_si256((self.hi.as_ptr().add(i) as *const __m256i).add(v / 4));
        let top = match v % 4 {
            0 => _mm256_slli_epi16::<4>(c),
            1 => _mm256_slli_epi16::<2>(c),
            2 => c,
            _ => _mm256_srli_epi16::<2>(c),
        };
        _mm256_or_si256(low, _mm256_and_si256(top, top2))
    }

    /// [`Group8::tile`] of Q8_0 without VNNI: one register of values at a
    /// time (and its `|w|`) meets every activation row, so only the rows'
    /// sums stay live (the general tile keeps a block's eight registers and
    /// their eight magnitudes, more than AVX2's sixteen); the same integer
    /// sums and float operations as the general tile, so the same bits.
    ///
    /// Four vector operations per register and activation row (`vpsignb`,
    /// `vpmaddubsw`, `vpmaddwd` by ones, `vpaddd`): with two signed bytes
    /// a pair of products reaches `2 * 127 * 127`, so no two `vpmaddubsw`
    /// results add in 16 bits as the 4- and 6-bit tiles' do. Forms without
    /// the sign step need 7-bit activations (biased `w + 128` against
    /// `|x| <= 63`); that loss was not taken (`benches/README.md`, "Q8_0
    /// prefill against what AVX2 allows").
    ///
    /// With VNNI (`vpdpbusd`), each register is made unsigned as `q + 128`
    /// (its sign bit flipped) and meets every activation row in one
    /// `vpdpbusd` (no `vpsignb` or `vpabsb`), each row's block sum starting
    /// from the activations' `-128 sum(x)` ([`crate::act::Bias`]), in two
    /// chains per row (even and odd registers: one chain of eight waited
    /// on the instruction's latency); the same integer sums.
    ///
    /// # Safety
    /// As [`Group8::tile`] (only called with `BITS == 8`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn tile_q8<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!(BITS == 8 && !self.scales.has_offset() && !S::HALVES);
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        let vnni = VNNI != NO_VNNI;
        assert!(!vnni || (acts.bias.len() == acts.qs.len() && !acts.tiled));
        let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(i8::MIN));
        let mut acc = [_mm256_setzero_ps(); A];
        for b in 0..nb {
            let i = g * nb + b;
            if PREFETCH {
                self.prefetch_ahead(i);
            }
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            let x: [*const i32; A] =
                std::array::from_fn(|j| acts.qs.as_ptr().add((a + j) * nb + b) as *const i32);
            // Without VNNI a pair of products reaches 2 * 127 * 127: to
            // i32 at once. (Loops, not closures: a closure would not
            // inherit the caller's target features.)
            let mut s = [[_mm256_setzero_si256(); 2]; A];
            if vnni {
                for (j, s) in s.iter_mut().enumerate() {
                    s[0] = _mm256_set1_epi32((*acts.bias.as_ptr().add((a + j) * nb + b)).all128);
                }
            }
            for v in 0..G {
                let w = _mm256_load_si256(p.add(v));
                if vnni {
                    let w = _mm256_xor_si256(w, flip);
                    for (s, x) in s.iter_mut().zip(&x) {
                        let xv = _mm256_set1_epi32(x.add(v).read());
                        s[v % 2] = dpbusd::<VNNI>(s[v % 2], w, xv);
                    }
                    continue;
                }
                let wa = _mm256_abs_epi8(w);
                for (s, x) in s.iter_mut().zip(&x) {
                    let signed = _mm256_sign_epi8(_mm256_set1_epi32(x.add(v).read()), w);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, signed), ones);
                    s[0] = _mm256_add_epi32(s[0], p);
                }
            }
            let [d, _] = self.scales.factors(i);
            for (j, (acc, s)) in acc.iter_mut().zip(s).enumerate() {
                let s = if vnni {
                    _mm256_add_epi32(s[0], s[1])
                } else {
                    s[0]
                };
                let dx = _mm256_set1_ps(*acts.d.get_unchecked((a + j) * nb + b));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, dx), *acc);
            }
        }
        // As the general tile, which adds its (zero) offsets' sums.
        for acc in &mut acc {
            *acc = _mm256_add_ps(*acc, _mm256_setzero_ps());
        }
        acc
    }

    /// [`Group8::tile`] of Q6_K without VNNI over activations with one
    /// scale per 256 values, a super-block at a time: two registers of
    /// values at a time meet every activation row, the two `vpmaddubsw`
    /// pair sums added in i16 (at most `2 * 2 * 63 * 127 = 32004`) and
    /// multiplied by the pairs of their half's scale (`vpmaddwd`) into the
    /// row's sum, which starts each block from `-32 (sc_0 X_0 + sc_1 X_1)`
    /// (the halves' activation sums, one `vpmaddwd`); one float operation
    /// per super-block. A super-block's sum stays below `8 * 32 * 128 * 95
    /// * 127 < 2^31`.
    ///
    /// With VNNI, each half's four registers go into one `vpdpbusd` chain
    /// per row that starts from the half's `-32 X`, and the half's sum
    /// times its scale (`vpmulld`) into the row's: the same integer sums,
    /// so the same bits.
    ///
    /// # Safety
    /// As [`Group8::tile`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn tile_span256<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        d: &[Half8],
        sc: &[[[i8; G]; 2]],
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!((g + 1) * nb <= self.stored() && (a + A) * nb <= acts.qs.len());
        assert!(sc.len() == self.stored() && d.len() * SPAN_BLOCKS == self.stored());
        assert!(!acts.tiled, "activation rows in order");
        let mut acc = [_mm256_setzero_ps(); A];
        for t in 0..nb / SPAN_BLOCKS {
            let i0 = g * nb + t * SPAN_BLOCKS;
            let mut s = [_mm256_setzero_si256(); A];
            for i in i0..i0 + SPAN_BLOCKS {
                if PREFETCH {
                    self.prefetch_ahead(i);
                }
                let x: [*const i32; A] = std::array::from_fn(|j| {
                    acts.qs.as_ptr().add((a + j) * nb + i - g * nb) as *const i32
                });
                // Each half's scale as 16-bit pairs (`sc` in both halves of
                // each row's lane), and `-32 (sc_0, sc_1)` for the bias.
                let [c0, c1] = sc.get_unchecked(i);
                let (c0, c1) = (
                    _mm_loadl_epi64(c0.as_ptr().cast()),
                    _mm_loadl_epi64(c1.as_ptr().cast()),
                );
                if VNNI != NO_VNNI {
                    let c = [_mm256_cvtepi8_epi32(c0), _mm256_cvtepi8_epi32(c1)];
                    let mut h = [[_mm256_setzero_si256(); 2]; A];
                    for (j, h) in h.iter_mut().enumerate() {
                        let bias = &*acts.bias.as_ptr().add((a + j) * nb + i - g * nb);
                        h[0] = _mm256_set1_epi32(bias.halves32[0]);
                        h[1] = _mm256_set1_epi32(bias.halves32[1]);
                    }
                    for v in 0..G {
                        let w = self.value6(i, v);
                        for (h, x) in h.iter_mut().zip(&x) {
                            let xv = _mm256_set1_epi32(x.add(v).read());
                            h[v / 4] = dpbusd::<VNNI>(h[v / 4], w, xv);
                        }
                    }
                    for (s, h) in s.iter_mut().zip(h) {
                        let scaled = _mm256_add_epi32(
                            _mm256_mullo_epi32(h[0], c[0]),
                            _mm256_mullo_epi32(h[1], c[1]),
                        );
                        *s = _mm256_add_epi32(*s, scaled);
                    }
                    continue;
                }
                let pairs = [
                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(c0, c0)),
                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(c1, c1)),
                ];
                let bias = _mm256_mullo_epi16(
                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(c0, c1)),
                    _mm256_set1_epi16(-32),
                );
                for (j, s) in s.iter_mut().enumerate() {
                    let ai = (a + j) * nb + i - g * nb;
                    let halves = _mm256_set1_epi32((*acts.bias.as_ptr().add(ai)).halves);
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(bias, halves));
                }
                for q in 0..G / 2 {
                    let (w0, w1) = (self.value6(i, 2 * q), self.value6(i, 2 * q + 1));
                    for (s, x) in s.iter_mut().zip(&x) {
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w0, _mm256_set1_epi32(x.add(2 * q).read())),
                            _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x.add(2 * q + 1).read())),
                        );
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, pairs[q / 2]));
                    }
                }
            }
            let dw = d.get_unchecked(i0 / SPAN_BLOCKS).load();
            for (j, (acc, s)) in acc.iter_mut().zip(s).enumerate() {
                let dx = _mm256_set1_ps(*acts.d.get_unchecked((a + j) * nb + t * SPAN_BLOCKS));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, dx), *acc);
            }
        }
        acc
    }
}
