//! The 8-bit formats (Q5_0, Q5_1, Q8_0; Q6_K) with eight weight rows interleaved
//! (see the parent module).
//!
//! [`I8x8`] keeps signed 8-bit values (`w = f q (+ m)`, `q` in
//! -127..=127) with a group's block in 256 bytes: byte `32 k + 4 l + t`
//! (`k` in 0..8, `l` in 0..8, `t` in 0..4) is value `4 k + t` of row `l`;
//! the factors `f` and offsets `m` are kept as the format has them
//! ([`Scales`]: eight f16 scales, and offsets for Q5_1, per group's block;
//! Q6_K's signed 8-bit scales per 16 values under an f16 per 256, the
//! values being its `q - 32`).
//!
//! `vpmaddubsw` wants an unsigned first operand, so the SIMD kernel
//! multiplies `|w|` by the activation bytes carrying the sign of `w`
//! (`vpsignb`); a pair sum reaches `2 * 127 * 127`, so each product goes
//! to i32 at once (`vpmaddwd`) before the eight are added (with VNNI, eight
//! `vpdpbusd`), as two sums of four (values 0..16 and 16..32) for Q6_K's
//! two factors per block.

use super::scales::Scales;
use super::{group_blocks, interleave, Group8, G};
use crate::act::Acts;
use crate::formats::Q8;

/// One block of a group: 8 rows x 32 signed bytes (see the module docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8x8(pub [i8; 256]);

/// An 8-bit matrix with its rows interleaved by eight; block `b` of group
/// `g` at `g * nb + b`.
#[derive(Debug)]
pub(crate) struct I8x8<S> {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    pub qs: Vec<Q8x8>,
    pub scales: S,
}

impl<S: Scales> I8x8<S> {
    /// Interleaves `n` rows of `nb` blocks (`qs`: block `b` of row `r` at
    /// `r * nb + b`) whose scales, already interleaved, are `scales`.
    ///
    /// # Panics
    /// If `scales` covers another number of blocks.
    pub(crate) fn new(qs: &[Q8], n: usize, nb: usize, scales: S) -> Self {
        let qs: Vec<Q8x8> = group_blocks(n, nb)
            .map(|rows| Q8x8(interleave(rows.map(|i| i.map(|i| &qs[i].0)))))
            .collect();
        assert_eq!(scales.blocks(), qs.len(), "scales of another matrix");
        Self { n, nb, qs, scales }
    }
}

impl<S: Scales> Group8 for I8x8<S> {
    const HALVES: bool = S::HALVES;

    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        self.qs[i].0[32 * (j / 4) + 4 * l + j % 4] as i32
    }

    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        self.scales.get(i, l, j)
    }

    /// `PREFETCH` is ignored: the one 8-bit matrix of the default model
    /// (its 30 MB output head, one long stream the hardware prefetchers
    /// follow) decoded no faster with it.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile<const A: usize, const VNNI: bool, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        let ones = _mm256_set1_epi16(1);
        let offsets = self.scales.has_offset();
        let mut acc = [_mm256_setzero_ps(); A];
        let mut mins = [_mm256_setzero_ps(); A];
        for b in 0..nb {
            let i = g * nb + b;
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            let wabs: [__m256i; G] =
                std::array::from_fn(|k| _mm256_abs_epi8(_mm256_load_si256(p.add(k))));
            let [d0, d1] = self.scales.factors(i);
            for (j, acc) in acc.iter_mut().enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                // Values 0..16 and 16..32 summed apart (Q6_K scales each).
                let mut s = [_mm256_setzero_si256(); 2];
                for (k, &wk) in wabs.iter().enumerate() {
                    let xv = _mm256_set1_epi32(x.add(k).read());
                    let signed = _mm256_sign_epi8(xv, _mm256_load_si256(p.add(k)));
                    let h = &mut s[k / 4];
                    *h = if VNNI {
                        _mm256_dpbusd_epi32(*h, wk, signed)
                    } else {
                        _mm256_add_epi32(
                            *h,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wk, signed), ones),
                        )
                    };
                }
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(ai));
                if S::HALVES {
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[0]), _mm256_mul_ps(d0, dx), *acc);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1]), _mm256_mul_ps(d1, dx), *acc);
                } else {
                    let s = _mm256_add_epi32(s[0], s[1]);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d0, dx), *acc);
                }
            }
            if offsets {
                let mw = self.scales.offsets(i);
                for (j, mins) in mins.iter_mut().enumerate() {
                    let s = *acts.s.get_unchecked((a + j) * nb + b);
                    *mins = _mm256_fmadd_ps(mw, _mm256_set1_ps(s), *mins);
                }
            }
        }
        std::array::from_fn(|j| _mm256_add_ps(acc[j], mins[j]))
    }
}
