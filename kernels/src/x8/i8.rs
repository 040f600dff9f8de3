//! The 8-bit formats (Q5_0, Q5_1, Q8_0) with eight weight rows interleaved
//! (see the parent module).
//!
//! [`I8x8`] keeps the weights of [`I8`] (`w = d q (+ m)`, signed 8-bit `q`
//! in -127..=127) with a group's block in 256 bytes: byte `32 k + 4 l + t`
//! (`k` in 0..8, `l` in 0..8, `t` in 0..4) is value `4 k + t` of row `l`,
//! and eight f16 scales (and offsets for Q5_1) per group's block.
//!
//! `vpmaddubsw` wants an unsigned first operand, so the SIMD kernel
//! multiplies `|w|` by the activation bytes carrying the sign of `w`
//! (`vpsignb`); a pair sum reaches `2 * 127 * 127`, so each product goes
//! to i32 at once (`vpmaddwd`) before the eight are added (with VNNI, eight
//! `vpdpbusd`).

use super::{group_rows, interleave, Group8, Half8, G};
use crate::act::Acts;
use crate::formats::I8;
use crate::Error;

/// One block of a group: 8 rows x 32 signed bytes (see the module docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8x8(pub [i8; 256]);

/// An [`I8`] matrix with its rows interleaved by eight; block `b` of group
/// `g` at `g * nb + b`.
#[derive(Debug)]
pub(crate) struct I8x8 {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    pub qs: Vec<Q8x8>,
    pub d: Vec<Half8>,
    pub m: Option<Vec<Half8>>,
}

impl I8x8 {
    /// Interleaves the `n` rows of `w`.
    pub(crate) fn new(w: &I8, n: usize) -> Result<Self, Error> {
        let nb = w.nb;
        let groups = n.div_ceil(G);
        let mut x = I8x8 {
            n,
            nb,
            qs: Vec::with_capacity(groups * nb),
            d: Vec::with_capacity(groups * nb),
            m: w.m.as_ref().map(|_| Vec::with_capacity(groups * nb)),
        };
        for g in 0..groups {
            for b in 0..nb {
                let rows = group_rows(n, nb, g, b);
                x.qs.push(Q8x8(interleave(rows.map(|i| i.map(|i| &w.qs[i].0)))));
                x.d.push(Half8::gather(rows, &w.d)?);
                if let (Some(out), Some(m)) = (x.m.as_mut(), w.m.as_ref()) {
                    out.push(Half8::gather(rows, m)?);
                }
            }
        }
        Ok(x)
    }
}

impl Group8 for I8x8 {
    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        self.qs[i].0[32 * (j / 4) + 4 * l + j % 4] as i32
    }

    fn scale_offset(&self, i: usize, l: usize) -> (f32, f32) {
        (
            self.d[i].get(l),
            self.m.as_ref().map_or(0.0, |m| m[i].get(l)),
        )
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
        let mut acc = [_mm256_setzero_ps(); A];
        let mut mins = [_mm256_setzero_ps(); A];
        for b in 0..nb {
            let i = g * nb + b;
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            let wabs: [__m256i; G] =
                std::array::from_fn(|k| _mm256_abs_epi8(_mm256_load_si256(p.add(k))));
            let dw = self.d.get_unchecked(i).load();
            for (j, acc) in acc.iter_mut().enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                let mut s = _mm256_setzero_si256();
                for (k, &wk) in wabs.iter().enumerate() {
                    let xv = _mm256_set1_epi32(x.add(k).read());
                    let signed = _mm256_sign_epi8(xv, _mm256_load_si256(p.add(k)));
                    s = if VNNI {
                        _mm256_dpbusd_epi32(s, wk, signed)
                    } else {
                        _mm256_add_epi32(
                            s,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wk, signed), ones),
                        )
                    };
                }
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*acts.d.get_unchecked(ai)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, *acc);
            }
            if let Some(m) = &self.m {
                let mw = m.get_unchecked(i).load();
                for (j, mins) in mins.iter_mut().enumerate() {
                    let s = *acts.s.get_unchecked((a + j) * nb + b);
                    *mins = _mm256_fmadd_ps(mw, _mm256_set1_ps(s), *mins);
                }
            }
        }
        std::array::from_fn(|j| _mm256_add_ps(acc[j], mins[j]))
    }
}
