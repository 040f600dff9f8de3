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
//!
//! Q4_K and Q5_K on CPUs without AVX-512 VNNI meet activations with one
//! scale per 256 values ([`crate::Format::activation_span`], llama.cpp's
//! Q8_K), so a super-block sums in integers, as Q2_K's kernels do: `S1 =
//! sum_b sc_b sum_j q_j x_j` (the 16-bit sums times the pairs of 6-bit
//! scales, `vpmaddwd` in place of the one against ones) and `S2 = sum_b
//! mn_b X_b` (the mins of each two blocks times the activations' block
//! sums, [`Acts::pairs`]: four `vpmaddwd` per super-block), then `(d S1 -
//! dmin S2) d_x` once per 256 values instead of two scales, a conversion
//! and two FMAs per 32. That tile also takes one value register at a time
//! to every activation row (the rows' sums and one register live, not the
//! block's eight registers and spilled sums): Q4_K 1.26-1.41x, Q5_K
//! 1.26-1.27x on an AVX2-only Zen 3 (`benches/README.md`, `benches/HISTORY.md`).
//!
//! On CPUs with AVX-512 VNNI, decode steps (up to four activation rows,
//! bound by memory) keep 32-value activation scales and the per-block
//! float work above; prompt steps take 256-value scales, and each block's
//! `d sc isum` and `m X` (`X` the activations' block quant sum) add into
//! the span's sum in floats, which takes the span's `d_x` once
//! ([`Ux8::tile_span_float`], the 512-bit and AMX tiles'
//! [`Sums::SpanOffsets`], the same bits): one multiply fewer per block
//! and row, Q4_K_M prefill 1.07-1.26x faster on an Intel Xeon with AMX
//! (`benches/README.md`, `benches/HISTORY.md`).

#[cfg(target_arch = "x86_64")]
use super::hint;
use super::scales::{Scales, SuperK4};
#[cfg(target_arch = "x86_64")]
use super::simd::dpbusd;
#[cfg(target_arch = "x86_64")]
use super::wide::{join_ps, load_pair, Sums, Unpacked};
#[cfg(target_arch = "x86_64")]
use super::NO_VNNI;
use super::{dot_blocks, group_blocks, interleave, prefetch_blocks, Group8, G, SPAN_BLOCKS};
use crate::act::Acts;
use crate::formats::{Nib, QK};

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

    /// [`Group8::dot`] of the K-quants `k` over activations with one scale
    /// per 256 values: per super-block, `S1 = sum_b sc_b sum_j q_j x_j` and
    /// `S2 = sum_b mn_b X_b` (`X_b` the sum of block `b`'s quantized
    /// activations) in integers, then `(d S1 - dmin S2) d_x`.
    fn dot_span256(&self, k: &SuperK4, acts: &Acts, g: usize, l: usize, a: usize) -> f32 {
        let nb = self.nb;
        let mut acc = 0f32;
        let (mut s1, mut s2) = (0i32, 0i32);
        for b in 0..nb {
            let (i, ai) = (g * nb + b, a * nb + b);
            let x = &acts.qs[ai].0;
            let isum: i32 = (0..QK)
                .map(|j| self.value(i, l, j) as i32 * x[j] as i32)
                .sum();
            s1 += k.sc[i][l] as i32 * isum;
            s2 += k.mn[i][l] as i32 * acts.bias[ai].sum();
            if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                let (d, dmin) = (k.d[i / G].get(l), k.dmin[i / G].get(l));
                acc += (d * s1 as f32 + -dmin * s2 as f32) * acts.d[ai];
                (s1, s2) = (0, 0);
            }
        }
        acc
    }

    /// Group block `i`'s values as the eight registers of the module docs.
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn values256(&self, i: usize) -> [std::arch::x86_64::__m256i; G] {
        let mut wv = [std::arch::x86_64::_mm256_setzero_si256(); G];
        for (v, w) in wv.iter_mut().enumerate() {
            *w = self.value256(i, v);
        }
        wv
    }

    /// Register `v` of [`Ux8::values256`]: values `4 (v % 4)..+4` and, for
    /// `v >= 4`, `16 + ..` of every row, from the 32-byte load `v % 4` (its
    /// low nibbles, then its high ones); for 5-bit values OR'd with bit `v`
    /// of the fifth bits' bytes, moved to bit 4 by one 16-bit shift (bits
    /// crossing into the neighbouring byte land elsewhere than bit 4).
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn value256(&self, i: usize, v: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        let low4 = _mm256_set1_epi8(0x0F);
        let raw = _mm256_load_si256((self.qs.as_ptr().add(i) as *const __m256i).add(v % 4));
        let w = if v < 4 {
            _mm256_and_si256(raw, low4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4)
        };
        if FIVE {
            let h = _mm256_load_si256(self.qh.as_ptr().add(i).cast());
            let moved = match v {
                0 => _mm256_slli_epi16::<4>(h),
                1 => _mm256_slli_epi16::<3>(h),
                2 => _mm256_slli_epi16::<2>(h),
                3 => _mm256_slli_epi16::<1>(h),
                4 => h,
                5 => _mm256_srli_epi16::<1>(h),
                6 => _mm256_srli_epi16::<2>(h),
                _ => _mm256_srli_epi16::<3>(h),
            };
            _mm256_or_si256(w, _mm256_and_si256(moved, _mm256_set1_epi8(0x10)))
        } else {
            w
        }
    }

    /// [`Group8::tile`] without VNNI for the K-quants `k` over activations
    /// with one scale per 256 values ([`Ux8::dot_span256`]'s sums), a
    /// super-block at a time: each block's 16-bit sums meet the pairs of
    /// sub-block scales in `vpmaddwd` into `S1`; after the eight blocks the
    /// mins of each two blocks meet the activations' block sums
    /// ([`Acts::pairs`]) in four more, and the float work is once per
    /// super-block.
    ///
    /// # Safety
    /// As [`Group8::tile`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile_span256<const A: usize, const PREFETCH: bool>(
        &self,
        k: &SuperK4,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        assert!(k.sc.len() == self.qs.len() && k.d.len() * SPAN_BLOCKS == self.qs.len());
        assert!(!acts.tiled && acts.pairs.len() * 2 == acts.qs.len());
        let mut acc = [_mm256_setzero_ps(); A];
        for t in 0..nb / SPAN_BLOCKS {
            let i0 = g * nb + t * SPAN_BLOCKS;
            let mut s1 = [_mm256_setzero_si256(); A];
            for i in i0..i0 + SPAN_BLOCKS {
                if PREFETCH {
                    self.prefetch_ahead(i);
                }
                let sc = u8_pairs(k.sc.get_unchecked(i));
                // One value register at a time, met by every row's
                // activations: few registers live (the rows' sums), none
                // spilled.
                let x: [*const i32; A] = std::array::from_fn(|j| {
                    acts.qs.as_ptr().add((a + j) * nb + i - g * nb) as *const i32
                });
                let mut s16 = [[_mm256_setzero_si256(); 2]; A];
                for v in 0..G {
                    let w = self.value256(i, v);
                    for (s16, x) in s16.iter_mut().zip(&x) {
                        let xv = _mm256_set1_epi32(x.add(v).read());
                        let h = &mut s16[if FIVE { v / 4 } else { 0 }];
                        *h = _mm256_add_epi16(*h, _mm256_maddubs_epi16(w, xv));
                    }
                }
                for (s1, s16) in s1.iter_mut().zip(&s16) {
                    *s1 = _mm256_add_epi32(*s1, _mm256_madd_epi16(s16[0], sc));
                    if FIVE {
                        *s1 = _mm256_add_epi32(*s1, _mm256_madd_epi16(s16[1], sc));
                    }
                }
            }
            // The mins of blocks `2 p` and `2 p + 1` as 16-bit pairs.
            let mn: [__m256i; SPAN_BLOCKS / 2] = std::array::from_fn(|p| {
                let m0 = _mm_loadl_epi64(k.mn.get_unchecked(i0 + 2 * p).as_ptr().cast());
                let m1 = _mm_loadl_epi64(k.mn.get_unchecked(i0 + 2 * p + 1).as_ptr().cast());
                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m0, m1))
            });
            let d = k.d.get_unchecked(i0 / SPAN_BLOCKS).load();
            let nd = _mm256_sub_ps(
                _mm256_setzero_ps(),
                k.dmin.get_unchecked(i0 / SPAN_BLOCKS).load(),
            );
            for (j, (acc, s1)) in acc.iter_mut().zip(s1).enumerate() {
                let row = (a + j) * nb + t * SPAN_BLOCKS;
                let pairs = acts.pairs.as_ptr().add(row / 2);
                let mut s2 = _mm256_setzero_si256();
                for (p, &mn) in mn.iter().enumerate() {
                    let x = _mm256_set1_epi32(pairs.add(p).read());
                    s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(mn, x));
                }
                // `(d S1 - dmin S2) d_x`.
                let f = _mm256_fmadd_ps(
                    nd,
                    _mm256_cvtepi32_ps(s2),
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1)),
                );
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(row));
                *acc = _mm256_fmadd_ps(f, dx, *acc);
            }
        }
        acc
    }

    /// One activation row's integer sums over a block whose values are
    /// `wv` ([`Ux8::values256`]), the row's quantized block at `x`: eight
    /// `vpdpbusd` with VNNI; else `vpmaddubsw` pair sums added in i16
    /// (eight reach `8 * 2 * 15 * 127 = 30480` for 4-bit values; 5-bit
    /// ones go to i32 by fours, `4 * 2 * 31 * 127 = 31496`) and widened by
    /// `vpmaddwd` against `ones` (sixteen 1s).
    ///
    /// # Safety
    /// AVX2, and the `vpdpbusd` `VNNI` names; `x` points at 32 bytes.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn isum256<const VNNI: u8>(
        wv: &[std::arch::x86_64::__m256i; G],
        x: *const i32,
        ones: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        if VNNI != NO_VNNI {
            // One chain: two (even and odd registers) made decode of 1B
            // Q4_K_M 2-6% slower (bound by memory there).
            let mut s = _mm256_setzero_si256();
            for (v, &wk) in wv.iter().enumerate() {
                s = dpbusd::<VNNI>(s, wk, _mm256_set1_epi32(x.add(v).read()));
            }
            return s;
        }
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
    }

    /// [`Group8::tile`] for the K-quants over activations with one scale
    /// per 256 values on CPUs with AVX-512 VNNI (prompt steps; the 512-bit
    /// and AMX tiles' [`Sums::SpanOffsets`], with the same bits): each
    /// block's `d sc isum` and `m X` (`X` the activations' quant sum) into
    /// the span's sum, which takes the span's `d_x` once at its end.
    ///
    /// # Safety
    /// As [`Group8::tile`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile_span_float<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        assert!(acts.span == 256 && nb.is_multiple_of(S::SPAN));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        let mut sp = [_mm256_setzero_ps(); A];
        for t in 0..nb / S::SPAN {
            let span = self.scales.span(g * nb + t * S::SPAN);
            for b in t * S::SPAN..(t + 1) * S::SPAN {
                let i = g * nb + b;
                if PREFETCH {
                    self.prefetch_ahead(i);
                }
                let [dw, _] = self.scales.factors_in(span, i);
                let mw = self.scales.offsets_in(span, i);
                if VNNI != NO_VNNI {
                    // One value register at a time to every row. Up to
                    // four rows, two `vpdpbusd` chains per row (even and
                    // odd registers): the block's eight registers and one
                    // chain per row waited on its latency. Eight rows (the
                    // AVX-VNNI prompt tiles, [`Group8::tall_tiles`]) are
                    // eight chains already, and sixteen sums would not fit
                    // the sixteen registers.
                    let chains = if A > 4 { 1 } else { 2 };
                    let mut s = [[_mm256_setzero_si256(); 2]; A];
                    for v in 0..G {
                        let w = self.value256(i, v);
                        for (j, s) in s.iter_mut().enumerate() {
                            let x = acts.qs.as_ptr().add((a + j) * nb + b) as *const i32;
                            let xv = _mm256_set1_epi32(x.add(v).read());
                            s[v % chains] = dpbusd::<VNNI>(s[v % chains], w, xv);
                        }
                    }
                    for (j, (sp, s)) in sp.iter_mut().zip(s).enumerate() {
                        let isum = _mm256_add_epi32(s[0], s[1]);
                        let sx = *acts.s.get_unchecked((a + j) * nb + b);
                        *sp = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dw, *sp);
                        *sp = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), *sp);
                    }
                    continue;
                }
                let wv = self.values256(i);
                for (j, sp) in sp.iter_mut().enumerate() {
                    let ai = (a + j) * nb + b;
                    let x = acts.qs.as_ptr().add(ai) as *const i32;
                    let isum = Self::isum256::<VNNI>(&wv, x, ones);
                    *sp = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dw, *sp);
                    *sp = _mm256_fmadd_ps(mw, _mm256_set1_ps(*acts.s.get_unchecked(ai)), *sp);
                }
            }
            for (j, (acc, sp)) in acc.iter_mut().zip(sp.iter_mut()).enumerate() {
                let dx = _mm256_set1_ps(*acts.d.get_unchecked((a + j) * nb + t * S::SPAN));
                *acc = _mm256_fmadd_ps(*sp, dx, *acc);
                *sp = _mm256_setzero_ps();
            }
        }
        acc
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

    /// The K-quants' span tile ([`Ux8::tile_span_float`]), whose rows
    /// keep one chain each at eight.
    #[cfg(target_arch = "x86_64")]
    fn tall_tiles(&self, acts: &Acts) -> bool {
        self.scales.super_k4().is_some() && acts.span == 256
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

    fn dot(&self, acts: &Acts, g: usize, l: usize, a: usize) -> f32 {
        match self.scales.super_k4() {
            Some(k) if acts.span == 256 => self.dot_span256(k, acts, g, l, a),
            _ => dot_blocks(self, acts, g, l, a),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        if let Some(k) = self.scales.super_k4() {
            if acts.span == 256 {
                if VNNI != NO_VNNI || crate::wide_kernels() {
                    return self.tile_span_float::<A, VNNI, PREFETCH>(acts, g, a);
                }
                return self.tile_span256::<A, PREFETCH>(k, acts, g, a);
            }
        }
        let nb = self.nb;
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        // The scales' shared part, loaded once per span.
        let mut span = self.scales.span(g * nb);
        for b in 0..nb {
            let i = g * nb + b;
            if PREFETCH {
                self.prefetch_ahead(i);
            }
            if b.is_multiple_of(S::SPAN) {
                span = self.scales.span(i);
            }
            let wv = self.values256(i);
            let [dw, _] = self.scales.factors_in(span, i);
            let mw = self.scales.offsets_in(span, i);
            for (j, acc) in acc.iter_mut().enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                let isum = Self::isum256::<VNNI>(&wv, x, ones);
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*acts.d.get_unchecked(ai)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, *acc);
                *acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(*acts.s.get_unchecked(ai)), *acc);
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    const SUMS: Sums = if S::SPAN > 1 {
        Sums::SpanOffsets
    } else {
        Sums::Offsets
    };

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

/// Eight bytes as 16-bit pairs, one per 32-bit lane (`b` in both halves).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn u8_pairs(b: &[u8; G]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast()));
    _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
}
