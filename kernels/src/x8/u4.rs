//! The 4- and 5-bit formats (Q4_0, Q4_1, Q4_K; Q5_0, Q5_1, Q5_K) with eight
//! weight rows interleaved (see the parent module).
//!
//! [`Ux8`] keeps 4-bit (or 5-bit) values `q` (`w = f q + m`) with a group's
//! block in 128 bytes of nibbles (and 32 bytes of fifth bits):
//!
//! - byte `32 k + 4 l + t` (`k` in 0..4, `l` in 0..8, `t` in 0..4) holds
//!   the low four bits of value `4 k + t` of row `l` in its low nibble and
//!   of value `16 + 4 k + t` in its high nibble, which is exactly byte `4 k
//!   + t` of that row's Q4_0/Q4_1 block;
//! - for 5-bit values ([`U5x8`]: Q5_0 as `q - 16` with offset `-16 d`,
//!   Q5_1, Q5_K) bit `v` of byte `4 l + t` of the 32-byte [`Bits8`] is the
//!   fifth bit of value `4 v + t` of row `l`;
//! - the factors and offsets of the group's block are kept as the format
//!   has them ([`Scales`]: eight f16 scales and offsets for Q4_0, Q4_1,
//!   Q5_0 and Q5_1; the K-quants' 6-bit sub-block scales and mins under
//!   f16 super-block scales).
//!
//! The SIMD kernel unpacks a group's block into eight registers (`w_v`:
//! values `4 v..4 v + 4` of every row, low nibbles of the four 32-byte
//! loads then high nibbles; for 5-bit values, OR'd with bit `v` of the
//! fifth bits' bytes moved to bit 4 by one 16-bit shift and a mask);
//! `vpmaddubsw` against the broadcast activation bytes adds two pairs per
//! lane, eight of those are summed in i16 (at most `8 * 2 * 15 * 127 =
//! 30480`: no overflow; 5-bit values by fours) and `vpmaddwd` makes each
//! lane a row's block sum (with VNNI, eight `vpdpbusd` into i32).

#[cfg(target_arch = "x86_64")]
use super::hint;
use super::scales::Scales;
#[cfg(target_arch = "x86_64")]
use super::wide::{join_ps, load_pair, Sums, Unpacked};
use super::{group_blocks, interleave, prefetch_blocks, Group8, G};
use crate::act::Acts;
use crate::formats::Nib;

/// One block of a group: 8 rows x 32 values as nibbles (see the module
/// docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nib8(pub [u8; 128]);

/// The fifth bits of one block of a group: bit `v` of byte `4 l + t` is
/// the fifth bit of value `4 v + t` of row `l` (see the module docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bits8(pub [u8; 32]);

/// A 4-bit (or, with `FIVE`, 5-bit) matrix with its rows interleaved by
/// eight; block `b` of group `g` at `g * nb + b`.
#[derive(Debug)]
pub(crate) struct Ux8<S, const FIVE: bool> {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    pub qs: Vec<Nib8>,
    /// The fifth bits with `FIVE`, else empty.
    pub qh: Vec<Bits8>,
    pub scales: S,
}

/// 4-bit values.
pub(crate) type U4x8<S> = Ux8<S, false>;
/// 5-bit values.
pub(crate) type U5x8<S> = Ux8<S, true>;

impl<S: Scales, const FIVE: bool> Ux8<S, FIVE> {
    /// Interleaves `n` rows of `nb` blocks (`qs`: block `b` of row `r` at
    /// `r * nb + b`; with `FIVE`, `high[r * nb + b]` has bit `j` set where
    /// value `j` has its fifth bit) whose scales, already interleaved, are
    /// `scales`.
    ///
    /// # Panics
    /// If `scales` has a factor per half block (the kernel takes one per
    /// block) or covers another number of blocks, or `high` is missing (or
    /// given without `FIVE`).
    pub(crate) fn new(qs: &[Nib], high: Option<&[u32]>, n: usize, nb: usize, scales: S) -> Self {
        assert!(!S::HALVES, "one factor per 4- or 5-bit block");
        assert_eq!(high.is_some(), FIVE, "fifth bits with 5-bit values only");
        let qs: Vec<Nib8> = group_blocks(n, nb)
            .map(|rows| Nib8(interleave(rows.map(|i| i.map(|i| &qs[i].0)))))
            .collect();
        let qh = high.map_or_else(Vec::new, |high| {
            group_blocks(n, nb)
                .map(|rows| {
                    let mut bits = [0u8; 32];
                    for (l, i) in rows.iter().enumerate() {
                        let Some(&i) = i.as_ref() else { continue };
                        for j in 0..32 {
                            let bit = ((high[i] >> j) & 1) as u8;
                            bits[4 * l + j % 4] |= bit << (j / 4);
                        }
                    }
                    Bits8(bits)
                })
                .collect()
        });
        assert_eq!(scales.blocks(), qs.len(), "scales of another matrix");
        Self {
            n,
            nb,
            qs,
            qh,
            scales,
        }
    }

    /// Value `j` (0..32) of row `l` of block `i`.
    fn value(&self, i: usize, l: usize, j: usize) -> u8 {
        let (k, t, high) = ((j % 16) / 4, j % 4, j >= 16);
        let byte = self.qs[i].0[32 * k + 4 * l + t];
        let low = if high { byte >> 4 } else { byte & 0xF };
        if FIVE {
            low | (((self.qh[i].0[4 * l + t] >> (j / 4)) & 1) << 4)
        } else {
            low
        }
    }
}

impl<S: Scales, const FIVE: bool> Group8 for Ux8<S, FIVE> {
    const HALVES: bool = S::HALVES;
    const AHEAD: usize = prefetch_blocks::<Nib8>();

    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        self.value(i, l, j) as i32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        hint::<HINT, _>(&self.qs, i, 2);
        if FIVE {
            hint::<HINT, _>(&self.qh, i, 1);
        }
        self.scales.prefetch::<HINT>(i);
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
        // The scales' shared part, loaded once per span.
        let mut span = self.scales.span(g * nb);
        for b in 0..nb {
            let i = g * nb + b;
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            if PREFETCH {
                self.prefetch_ahead(i);
            }
            if b.is_multiple_of(S::SPAN) {
                span = self.scales.span(i);
            }
            let mut wv = [_mm256_setzero_si256(); G];
            for k in 0..4 {
                let raw = _mm256_load_si256(p.add(k));
                wv[k] = _mm256_and_si256(raw, low4);
                wv[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            }
            if FIVE {
                // Bit `v` of each byte to bit 4, for register `v`: 16-bit
                // shifts keep each byte's own bit there (bits crossing into
                // the neighbouring byte land elsewhere than bit 4).
                let h = _mm256_load_si256(self.qh.as_ptr().add(i).cast());
                let fifth = _mm256_set1_epi8(0x10);
                let moved = [
                    _mm256_slli_epi16::<4>(h),
                    _mm256_slli_epi16::<3>(h),
                    _mm256_slli_epi16::<2>(h),
                    _mm256_slli_epi16::<1>(h),
                    h,
                    _mm256_srli_epi16::<1>(h),
                    _mm256_srli_epi16::<2>(h),
                    _mm256_srli_epi16::<3>(h),
                ];
                for (w, m) in wv.iter_mut().zip(moved) {
                    *w = _mm256_or_si256(*w, _mm256_and_si256(m, fifth));
                }
            }
            let [dw, _] = self.scales.factors_in(span, i);
            let mw = self.scales.offsets_in(span, i);
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
                    // i16 sums of pairs: eight reach 8 * 2 * 15 * 127 =
                    // 30480 for 4-bit values; 5-bit ones go to i32 by fours
                    // (4 * 2 * 31 * 127 = 31496).
                    let mut s16 = [_mm256_setzero_si256(); 2];
                    for (v, &wk) in wv.iter().enumerate() {
                        let xv = _mm256_set1_epi32(x.add(v).read());
                        let h = &mut s16[if FIVE { v / 4 } else { 0 }];
                        *h = _mm256_add_epi16(*h, _mm256_maddubs_epi16(wk, xv));
                    }
                    let lo = _mm256_madd_epi16(s16[0], ones);
                    if FIVE {
                        _mm256_add_epi32(lo, _mm256_madd_epi16(s16[1], ones))
                    } else {
                        lo
                    }
                };
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*acts.d.get_unchecked(ai)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, *acc);
                *acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(*acts.s.get_unchecked(ai)), *acc);
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    const SUMS: Sums = Sums::Offsets;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_pair(&self, i0: usize, i1: usize) -> Unpacked {
        use std::arch::x86_64::*;
        let low4 = _mm512_set1_epi8(0x0F);
        let p0 = self.qs.as_ptr().add(i0) as *const __m256i;
        let p1 = self.qs.as_ptr().add(i1) as *const __m256i;
        let mut wv = [_mm512_setzero_si512(); G];
        for k in 0..4 {
            let raw = load_pair(p0.add(k), p1.add(k));
            wv[k] = _mm512_and_si512(raw, low4);
            wv[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
        }
        if FIVE {
            // As in `tile`.
            let h = load_pair(
                self.qh.as_ptr().add(i0).cast(),
                self.qh.as_ptr().add(i1).cast(),
            );
            let fifth = _mm512_set1_epi8(0x10);
            let moved = [
                _mm512_slli_epi16::<4>(h),
                _mm512_slli_epi16::<3>(h),
                _mm512_slli_epi16::<2>(h),
                _mm512_slli_epi16::<1>(h),
                h,
                _mm512_srli_epi16::<1>(h),
                _mm512_srli_epi16::<2>(h),
                _mm512_srli_epi16::<3>(h),
            ];
            for (w, m) in wv.iter_mut().zip(moved) {
                *w = _mm512_or_si512(*w, _mm512_and_si512(m, fifth));
            }
        }
        Unpacked {
            w: wv,
            d: join_ps(self.scales.factors(i0)[0], self.scales.factors(i1)[0]),
            m: join_ps(self.scales.offsets(i0), self.scales.offsets(i1)),
        }
    }
}
