//! The signed formats (Q8_0; Q6_K) with eight weight rows interleaved (see
//! the parent module).
//!
//! [`I8x8`] keeps signed 8-bit values (`w = f q`, `q` in -127..=127) with a
//! group's block in 256 bytes: byte `32 k + 4 l + t` (`k` in 0..8, `l` in
//! 0..8, `t` in 0..4) is value `4 k + t` of row `l`. [`I6x8`] keeps Q6_K's
//! `q - 32` as 6-bit `q` packed in 192 bytes (the low four bits as the
//! 4-bit layout's nibbles, the top two in a 64-byte plane), unpacked to
//! the same registers by the kernel. The factors `f` are kept as the
//! format has them ([`Scales`]: eight f16 scales per group's block; Q6_K's
//! signed 8-bit scales per 16 values under an f16 per 256).
//!
//! `vpmaddubsw` wants an unsigned first operand, so the SIMD kernel
//! multiplies `|w|` by the activation bytes carrying the sign of `w`
//! (`vpsignb`); a pair sum reaches `2 * 127 * 127`, so each product goes
//! to i32 at once (`vpmaddwd`) before the eight are added (with VNNI, eight
//! `vpdpbusd`), as two sums of four (values 0..16 and 16..32) for Q6_K's
//! two factors per block. The 512-bit kernels (`wide.rs`, no `vpsignb`)
//! unpack the values with a bias instead, `q + 128` or `q + 32` as unsigned
//! bytes, and start each sum from the activations' correction.

use super::scales::Scales;
use super::u4::Nib8;
#[cfg(target_arch = "x86_64")]
use super::wide::{join_ps, load_pair, Sums, Unpacked};
use super::{group_blocks, interleave, Group8, G, PREFETCH_BLOCKS};
use crate::act::Acts;
use crate::formats::Q8;

/// One block of a group: 8 rows x 32 signed bytes (see the module docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8x8(pub [i8; 256]);

/// Bits 4 and 5 of the 6-bit values of one block of a group: bits `2 (v %
/// 4)` and `2 (v % 4) + 1` of byte `32 (v / 4) + 4 l + t` are bits 4 and 5
/// of value `4 v + t` of row `l`.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crumbs8(pub [u8; 64]);

/// An 8-bit matrix with its rows interleaved by eight; block `b` of group
/// `g` at `g * nb + b`. With `SIX` the values are 6-bit (`q + 32` in 0..64
/// for `q` in -32..32, Q6_K), stored packed: their low four bits as in the
/// 4-bit layout ([`Nib8`]) and the top two in [`Crumbs8`].
#[derive(Debug)]
pub(crate) struct Ix8<S, const SIX: bool> {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    /// The values, without `SIX` (else empty).
    pub qs: Vec<Q8x8>,
    /// With `SIX`, the low and high bits of `q + 32` (else empty).
    pub lo: Vec<Nib8>,
    pub hi: Vec<Crumbs8>,
    pub scales: S,
}

/// Bytes.
pub(crate) type I8x8<S> = Ix8<S, false>;
/// Packed 6-bit values.
pub(crate) type I6x8<S> = Ix8<S, true>;

impl<S: Scales, const SIX: bool> Ix8<S, SIX> {
    /// Interleaves `n` rows of `nb` blocks (`qs`: block `b` of row `r` at
    /// `r * nb + b`; with `SIX` every value in -32..32) whose scales, already
    /// interleaved, are `scales`.
    ///
    /// # Panics
    /// If `scales` covers another number of blocks, or with `SIX` a value
    /// is out of range.
    pub(crate) fn new(qs: &[Q8], n: usize, nb: usize, scales: S) -> Self {
        let blocks = group_blocks(n, nb);
        let (plain_len, six_len) = if SIX {
            (0, blocks.len())
        } else {
            (blocks.len(), 0)
        };
        let mut plain = Vec::with_capacity(plain_len);
        let (mut lo, mut hi) = (Vec::with_capacity(six_len), Vec::with_capacity(six_len));
        let blocks = blocks.map(|rows| interleave(rows.map(|i| i.map(|i| &qs[i].0))));
        for q in blocks {
            if !SIX {
                plain.push(Q8x8(q));
                continue;
            }
            let u: [u8; 256] = std::array::from_fn(|e| {
                assert!(
                    (-32..32).contains(&q[e]),
                    "6-bit value {} out of range",
                    q[e]
                );
                (q[e] + 32) as u8
            });
            // Byte `32 v + 4 l + t` of `u` is value `4 v + t` of row `l`.
            let mut nib = [0u8; 128];
            let mut crumbs = [0u8; 64];
            for v in 0..G {
                for e in 0..32 {
                    let x = u[32 * v + e];
                    nib[32 * (v % 4) + e] |= (x & 0xF) << (4 * (v / 4));
                    crumbs[32 * (v / 4) + e] |= (x >> 4) << (2 * (v % 4));
                }
            }
            lo.push(Nib8(nib));
            hi.push(Crumbs8(crumbs));
        }
        let this = Self {
            n,
            nb,
            qs: plain,
            lo,
            hi,
            scales,
        };
        assert_eq!(
            this.scales.blocks(),
            this.qs.len().max(this.lo.len()),
            "scales of another matrix"
        );
        this
    }

    /// The eight registers of group block `i`: register `v` holds values
    /// `4 v..4 v + 4` of every row (see the module docs).
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load(&self, i: usize) -> [std::arch::x86_64::__m256i; G] {
        use std::arch::x86_64::*;
        if !SIX {
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            return std::array::from_fn(|v| _mm256_load_si256(p.add(v)));
        }
        let low4 = _mm256_set1_epi8(0x0F);
        let top2 = _mm256_set1_epi8(0x30);
        let p = self.lo.as_ptr().add(i) as *const __m256i;
        let h = self.hi.as_ptr().add(i) as *const __m256i;
        let (a, b) = (_mm256_load_si256(h), _mm256_load_si256(h.add(1)));
        // Bits `2 (v % 4)..` of each byte to bits 4 and 5: 16-bit shifts
        // move only the neighbouring byte's bits 0-3 or 6-7 across.
        let top = [
            _mm256_slli_epi16::<4>(a),
            _mm256_slli_epi16::<2>(a),
            a,
            _mm256_srli_epi16::<2>(a),
            _mm256_slli_epi16::<4>(b),
            _mm256_slli_epi16::<2>(b),
            b,
            _mm256_srli_epi16::<2>(b),
        ];
        let thirty_two = _mm256_set1_epi8(32);
        std::array::from_fn(|v| {
            let raw = _mm256_load_si256(p.add(v % 4));
            let low = if v < 4 {
                _mm256_and_si256(raw, low4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4)
            };
            let u = _mm256_or_si256(low, _mm256_and_si256(top[v], top2));
            _mm256_sub_epi8(u, thirty_two)
        })
    }

    /// Blocks `i0` and `i1` as [`Ix8::load`] has them, as the halves of
    /// 512-bit registers, with the bias of [`Group8::SUMS`]: the values
    /// plus 128 (8-bit) or 32 (6-bit), unsigned bytes.
    ///
    /// # Safety
    /// AVX-512 F/BW; both blocks exist.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load2_biased(&self, i0: usize, i1: usize) -> [std::arch::x86_64::__m512i; G] {
        use std::arch::x86_64::*;
        if !SIX {
            let p0 = self.qs.as_ptr().add(i0) as *const __m256i;
            let p1 = self.qs.as_ptr().add(i1) as *const __m256i;
            let flip = _mm512_set1_epi8(i8::MIN);
            return std::array::from_fn(|v| {
                _mm512_xor_si512(load_pair(p0.add(v), p1.add(v)), flip)
            });
        }
        let low4 = _mm512_set1_epi8(0x0F);
        let top2 = _mm512_set1_epi8(0x30);
        let p0 = self.lo.as_ptr().add(i0) as *const __m256i;
        let p1 = self.lo.as_ptr().add(i1) as *const __m256i;
        let h0 = self.hi.as_ptr().add(i0) as *const __m256i;
        let h1 = self.hi.as_ptr().add(i1) as *const __m256i;
        let (a, b) = (load_pair(h0, h1), load_pair(h0.add(1), h1.add(1)));
        // As in `load`.
        let top = [
            _mm512_slli_epi16::<4>(a),
            _mm512_slli_epi16::<2>(a),
            a,
            _mm512_srli_epi16::<2>(a),
            _mm512_slli_epi16::<4>(b),
            _mm512_slli_epi16::<2>(b),
            b,
            _mm512_srli_epi16::<2>(b),
        ];
        let raw: [__m512i; 4] = std::array::from_fn(|k| load_pair(p0.add(k), p1.add(k)));
        std::array::from_fn(|v| {
            let low = if v < 4 {
                _mm512_and_si512(raw[v], low4)
            } else {
                _mm512_and_si512(_mm512_srli_epi16::<4>(raw[v % 4]), low4)
            };
            _mm512_or_si512(low, _mm512_and_si512(top[v], top2))
        })
    }
}

impl<S: Scales, const SIX: bool> Group8 for Ix8<S, SIX> {
    const HALVES: bool = S::HALVES;

    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        let (v, e) = (j / 4, 4 * l + j % 4);
        if SIX {
            let low = (self.lo[i].0[32 * (v % 4) + e] >> (4 * (v / 4))) & 0xF;
            let top = (self.hi[i].0[32 * (v / 4) + e] >> (2 * (v % 4))) & 3;
            (low | (top << 4)) as i32 - 32
        } else {
            self.qs[i].0[32 * v + e] as i32
        }
    }

    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        self.scales.get(i, l, j)
    }

    /// With `PREFETCH` (one activation row: a decode step streaming the
    /// weights from memory), each block asks for the block
    /// [`PREFETCH_BLOCKS`] ahead: its values and its scales.
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
        let blocks = if SIX { self.lo.len() } else { self.qs.len() };
        assert!((g + 1) * nb <= blocks && (a + A) * nb <= acts.qs.len());
        let ones = _mm256_set1_epi16(1);
        let offsets = self.scales.has_offset();
        let mut acc = [_mm256_setzero_ps(); A];
        let mut mins = [_mm256_setzero_ps(); A];
        for b in 0..nb {
            let i = g * nb + b;
            if PREFETCH {
                // Past the matrix's end these are hints about addresses
                // that are never read, which do not fault.
                let ahead = i + PREFETCH_BLOCKS;
                if SIX {
                    let lo = self.lo.as_ptr().wrapping_add(ahead).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(lo);
                    _mm_prefetch::<_MM_HINT_T0>(lo.wrapping_add(64));
                    _mm_prefetch::<_MM_HINT_T0>(self.hi.as_ptr().wrapping_add(ahead).cast());
                } else {
                    let q = self.qs.as_ptr().wrapping_add(ahead).cast::<i8>();
                    for line in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64 * line));
                    }
                }
                self.scales.prefetch(ahead);
            }
            let w = self.load(i);
            let wabs = w.map(|w| _mm256_abs_epi8(w));
            let [d0, d1] = self.scales.factors(i);
            for (j, acc) in acc.iter_mut().enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                // Values 0..16 and 16..32 summed apart (Q6_K scales each).
                let mut s = [_mm256_setzero_si256(); 2];
                for (k, (&wk, &wa)) in w.iter().zip(&wabs).enumerate() {
                    let xv = _mm256_set1_epi32(x.add(k).read());
                    let signed = _mm256_sign_epi8(xv, wk);
                    let h = &mut s[k / 4];
                    *h = if VNNI {
                        _mm256_dpbusd_epi32(*h, wa, signed)
                    } else {
                        _mm256_add_epi32(
                            *h,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wa, signed), ones),
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

    #[cfg(target_arch = "x86_64")]
    const SUMS: Sums = match (SIX, S::HALVES) {
        (true, true) => Sums::Halves32,
        (false, false) => Sums::All128,
        _ => panic!("6-bit values come with a factor per half block, 8-bit with one"),
    };

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack2(&self, g: usize, out: &mut Vec<Unpacked>) {
        let nb = self.nb;
        let blocks = if SIX { self.lo.len() } else { self.qs.len() };
        assert!((g + 2) * nb <= blocks);
        out.clear();
        // A loop, as in the 4-bit layouts' `unpack2`.
        for b in 0..nb {
            let (i0, i1) = (g * nb + b, (g + 1) * nb + b);
            let [d00, d01] = self.scales.factors(i0);
            let [d10, d11] = self.scales.factors(i1);
            out.push(Unpacked {
                w: self.load2_biased(i0, i1),
                d: join_ps(d00, d10),
                m: join_ps(d01, d11),
            });
        }
    }
}
