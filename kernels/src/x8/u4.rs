//! The 4-bit formats (Q4_0, Q4_1, Q4_K) with eight weight rows interleaved (see
//! the parent module).
//!
//! [`U4x8`] keeps the weights of [`U4`] (`w = d q + m`, 4-bit `q`) with a
//! group's block in 128 bytes of nibbles:
//!
//! - byte `32 k + 4 l + t` (`k` in 0..4, `l` in 0..8, `t` in 0..4) holds
//!   value `4 k + t` of row `l` in its low nibble and value `16 + 4 k + t`
//!   in its high nibble, which is exactly byte `4 k + t` of that row's
//!   GGUF block;
//! - the factors and offsets of the group's block are kept as the format
//!   has them ([`Scales`]: eight f16 scales and offsets for Q4_0 and Q4_1;
//!   Q4_K's 6-bit sub-block scales and mins under f16 super-block scales).
//!
//! The SIMD kernel unpacks a group's block into eight registers (`w_i`:
//! values `4 i..4 i + 4` of every row, low nibbles of the four 32-byte
//! loads then high nibbles); `vpmaddubsw` against the broadcast activation
//! bytes adds two pairs per lane, eight of those are summed in i16 (at most
//! `8 * 2 * 15 * 127 = 30480`: no overflow) and one `vpmaddwd` makes each
//! lane a row's block sum (with VNNI, eight `vpdpbusd` into i32).

use super::scales::Scales;
use super::{group_blocks, interleave, Group8, G, PREFETCH_BLOCKS};
use crate::act::Acts;
use crate::formats::Nib;

/// One block of a group: 8 rows x 32 values as nibbles (see the module
/// docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nib8(pub [u8; 128]);

/// A 4-bit matrix with its rows interleaved by eight; block `b` of group
/// `g` at `g * nb + b`.
#[derive(Debug)]
pub(crate) struct U4x8<S> {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    pub qs: Vec<Nib8>,
    pub scales: S,
}

impl<S: Scales> U4x8<S> {
    /// Interleaves `n` rows of `nb` blocks (`qs`: block `b` of row `r` at
    /// `r * nb + b`) whose scales, already interleaved, are `scales`.
    ///
    /// # Panics
    /// If `scales` has a factor per half block (the 4-bit kernel takes one
    /// per block) or covers another number of blocks.
    pub(crate) fn new(qs: &[Nib], n: usize, nb: usize, scales: S) -> Self {
        assert!(!S::HALVES, "one factor per 4-bit block");
        let qs: Vec<Nib8> = group_blocks(n, nb)
            .map(|rows| Nib8(interleave(rows.map(|i| i.map(|i| &qs[i].0)))))
            .collect();
        assert_eq!(scales.blocks(), qs.len(), "scales of another matrix");
        Self { n, nb, qs, scales }
    }

    /// Value `j` (0..32) of row `l` of block `i` as a 4-bit integer.
    fn nibble(&self, i: usize, l: usize, j: usize) -> u8 {
        let (k, t, high) = ((j % 16) / 4, j % 4, j >= 16);
        let byte = self.qs[i].0[32 * k + 4 * l + t];
        if high {
            byte >> 4
        } else {
            byte & 0xF
        }
    }
}

impl<S: Scales> Group8 for U4x8<S> {
    const HALVES: bool = S::HALVES;

    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        self.nibble(i, l, j) as i32
    }

    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        self.scales.get(i, l, j)
    }

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
        let low4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        for b in 0..nb {
            let i = g * nb + b;
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            if PREFETCH {
                // Past the matrix's end these are hints about addresses
                // that are never read, which do not fault.
                let ahead = i + PREFETCH_BLOCKS;
                let q = self.qs.as_ptr().wrapping_add(ahead).cast::<i8>();
                _mm_prefetch::<_MM_HINT_T0>(q);
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64));
                self.scales.prefetch(ahead);
            }
            let mut wv = [_mm256_setzero_si256(); G];
            for k in 0..4 {
                let raw = _mm256_load_si256(p.add(k));
                wv[k] = _mm256_and_si256(raw, low4);
                wv[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            }
            let [dw, _] = self.scales.factors(i);
            let mw = self.scales.offsets(i);
            for (j, acc) in acc.iter_mut().enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                let isum = if VNNI {
                    let mut s = _mm256_setzero_si256();
                    for (v, &wk) in wv.iter().enumerate() {
                        s = _mm256_dpbusd_epi32(s, wk, _mm256_set1_epi32(x.add(v).read()));
                    }
                    s
                } else {
                    let mut s16 = _mm256_setzero_si256();
                    for (v, &wk) in wv.iter().enumerate() {
                        let xv = _mm256_set1_epi32(x.add(v).read());
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wk, xv));
                    }
                    _mm256_madd_epi16(s16, ones)
                };
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*acts.d.get_unchecked(ai)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, *acc);
                *acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(*acts.s.get_unchecked(ai)), *acc);
            }
        }
        acc
    }
}
