//! The signed formats (Q8_0; Q6_K, Q3_K) with eight weight rows interleaved
//! (see the parent module).
//!
//! [`I8x8`] keeps signed 8-bit values (`w = f q`, `q` in -127..=127) with a
//! group's block in 256 bytes: byte `32 k + 4 l + t` (`k` in 0..8, `l` in
//! 0..8, `t` in 0..4) is value `4 k + t` of row `l`. [`I6x8`] keeps Q6_K's
//! `q - 32` as 6-bit `q` packed in 192 bytes (the low four bits as the
//! 4-bit layout's nibbles, the top two in a 64-byte plane), and [`I3x8`]
//! Q3_K's `q - 4` as 3-bit `q` in 96 bytes (the low two bits in such a
//! plane, the third as the 5-bit layout's fifth bits), unpacked to the
//! same registers by the kernel. The factors `f` are kept as the
//! format has them ([`Scales`]: eight f16 scales per group's block; Q6_K's
//! signed 8-bit scales per 16 values under an f16 per 256). Q3_K's 16-value
//! scales are small integers, so its values are summed multiplied by them
//! (`p = sc q` in -124..=128) under one factor `d` per super-block; its
//! activations have one scale per 256 values
//! ([`crate::Format::activation_span`]), so a super-block's eight blocks
//! add up in integers before one float operation.
//!
//! `vpmaddubsw` wants an unsigned first operand, so the SIMD kernel
//! multiplies `|w|` by the activation bytes carrying the sign of `w`
//! (`vpsignb`); a pair sum reaches `2 * 127 * 127`, so each product goes
//! to i32 at once (`vpmaddwd`) before the eight are added (with VNNI, eight
//! `vpdpbusd`), as two sums of four (values 0..16 and 16..32) for Q6_K's
//! two factors per block (for Q3_K, each half's sum times its integer
//! scale, `vpmulld`: exactly the sum of the `p x`). Without VNNI, Q6_K's
//! 256-bit tile multiplies the stored `q + 32` instead (two pair sums of
//! values at most 63 add in i16) from the activations' correction, as the
//! 512-bit kernels do. The 512-bit kernels
//! (`wide.rs`, no `vpsignb`) unpack the values with a bias instead, `q +
//! 128`, `q + 32` or (Q3_K, multiplied by their scales at unpacking) `p +
//! 127` as unsigned bytes, and start each sum from the activations'
//! correction, so both give the same integer sums and the same bits.
//!
//! On CPUs without AVX-512 VNNI, Q6_K's activations have one scale per 256
//! values ([`crate::Format::activation_span`]) and its 256-bit tile sums a
//! super-block in integers: each pair of `vpmaddubsw` sums of the stored
//! `q + 32` meets its half's scale in `vpmaddwd` (in place of ones), each
//! block's sum starts from `-32 (sc_0 X_0 + sc_1 X_1)` (one `vpmaddwd` of
//! the scales against the activations' half sums), and one float
//! operation per super-block applies `d d_x` (`i8/tiles.rs`, with
//! Q8_0's AVX2 tile, which takes one register of values at a time to every
//! activation row). On CPUs with it, Q6_K's prompt steps (more than four
//! activation rows) take 256-value activation scales too, and the same
//! integer sums per super-block: the 512-bit tiles multiply each half
//! block's sum by its scale (`vpmulld`), the AMX tiles sum the values
//! times their scales split into two bytes ([`Sums::Span6`]); one float
//! operation per super-block and row, the same bits as that tile (which
//! also runs a matrix's lone last group there).

#[cfg(target_arch = "x86_64")]
use super::hint;
use super::scales::Scales;
#[cfg(target_arch = "x86_64")]
use super::simd::dpbusd;
use super::u4::{Bits8, Nib8};
#[cfg(target_arch = "x86_64")]
use super::wide::{join_ps, load_pair, Sums, Unpacked};
#[cfg(target_arch = "x86_64")]
use super::NO_VNNI;
use super::{dot_blocks, group_blocks, interleave, prefetch_blocks, Group8, G, SPAN_BLOCKS};
use crate::act::Acts;
use crate::formats::Q8;

mod tiles;

/// One block of a group: 8 rows x 32 signed bytes (see the module docs).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8x8(pub [i8; 256]);

/// Two bits of each value of one block of a group (bits 4 and 5 of 6-bit
/// values, bits 0 and 1 of 3-bit ones): bits `2 (v % 4)` and `2 (v % 4) +
/// 1` of byte `32 (v / 4) + 4 l + t` are those of value `4 v + t` of row
/// `l`.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crumbs8(pub [u8; 64]);

impl Crumbs8 {
    /// The low two bits of an interleaved block's values (byte `32 v + 4 l
    /// + t` of `u` is value `4 v + t` of row `l`).
    pub(crate) fn pack(u: &[u8; 256]) -> Self {
        let mut crumbs = [0u8; 64];
        for v in 0..G {
            for e in 0..32 {
                crumbs[32 * (v / 4) + e] |= (u[32 * v + e] & 3) << (2 * (v % 4));
            }
        }
        Crumbs8(crumbs)
    }

    /// The two bits of value `j` (0..32) of row `l`.
    pub(crate) fn get(&self, l: usize, j: usize) -> u8 {
        let v = j / 4;
        (self.0[32 * (v / 4) + 4 * l + j % 4] >> (2 * (v % 4))) & 3
    }

    /// A block's crumbs, loaded as two registers `a` (values `0..16` of
    /// every row) and `b`, into the eight registers of the kernels:
    /// register `v` holds values `4 v..4 v + 4` of every row, in 0..4 (a
    /// 16-bit shift moves only the neighbouring byte's other bits across,
    /// and the mask drops them). A loop, not a closure: a closure would not
    /// inherit the caller's target features, and its intrinsics would be
    /// calls.
    ///
    /// # Safety
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn regs256(
        a: std::arch::x86_64::__m256i,
        b: std::arch::x86_64::__m256i,
    ) -> [std::arch::x86_64::__m256i; G] {
        use std::arch::x86_64::*;
        let low2 = _mm256_set1_epi8(3);
        let mut out = [_mm256_setzero_si256(); G];
        for (v, out) in out.iter_mut().enumerate() {
            let c = if v < 4 { a } else { b };
            let low = match v % 4 {
                0 => c,
                1 => _mm256_srli_epi16::<2>(c),
                2 => _mm256_srli_epi16::<4>(c),
                _ => _mm256_srli_epi16::<6>(c),
            };
            *out = _mm256_and_si256(low, low2);
        }
        out
    }

    /// [`Crumbs8::regs256`] on 512-bit registers (two blocks).
    ///
    /// # Safety
    /// AVX-512 F/BW.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn regs512(
        a: std::arch::x86_64::__m512i,
        b: std::arch::x86_64::__m512i,
    ) -> [std::arch::x86_64::__m512i; G] {
        use std::arch::x86_64::*;
        let low2 = _mm512_set1_epi8(3);
        let mut out = [_mm512_setzero_si512(); G];
        for (v, out) in out.iter_mut().enumerate() {
            let c = if v < 4 { a } else { b };
            let low = match v % 4 {
                0 => c,
                1 => _mm512_srli_epi16::<2>(c),
                2 => _mm512_srli_epi16::<4>(c),
                _ => _mm512_srli_epi16::<6>(c),
            };
            *out = _mm512_and_si512(low, low2);
        }
        out
    }
}

/// A signed matrix of `BITS`-bit values (8, 6 or 3) with its rows
/// interleaved by eight; block `b` of group `g` at `g * nb + b`. 6-bit
/// values (`q + 32` in 0..64 for `q` in -32..32, Q6_K) are stored packed:
/// their low four bits as in the 4-bit layout ([`Nib8`]) and the top two in
/// [`Crumbs8`]; 3-bit values (`q + 4` in 0..8 for `q` in -4..4, Q3_K) their
/// low two bits in [`Crumbs8`] and the third in [`Bits8`].
#[derive(Debug)]
pub(crate) struct Ix8<S, const BITS: u32> {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    /// 8-bit values (else empty).
    pub qs: Vec<Q8x8>,
    /// The low four bits of 6-bit values (else empty).
    pub lo: Vec<Nib8>,
    /// Bits 4 and 5 of 6-bit values, bits 0 and 1 of 3-bit ones.
    pub hi: Vec<Crumbs8>,
    /// Bit 2 of 3-bit values (else empty).
    pub top: Vec<Bits8>,
    pub scales: S,
}

/// Bytes.
pub(crate) type I8x8<S> = Ix8<S, 8>;
/// Packed 6-bit values.
pub(crate) type I6x8<S> = Ix8<S, 6>;
/// Packed 3-bit values.
pub(crate) type I3x8<S> = Ix8<S, 3>;

impl<S: Scales, const BITS: u32> Ix8<S, BITS> {
    /// What `q` is stored with (unsigned: `q + BIAS`).
    const BIAS: i8 = match BITS {
        8 => 0,
        6 => 32,
        3 => 4,
        _ => panic!("8-, 6- or 3-bit values"),
    };

    /// Interleaves `n` rows of `nb` blocks (`qs`: block `b` of row `r` at
    /// `r * nb + b`; every value in `-BIAS..BIAS` for 6 and 3 bits) whose
    /// scales, already interleaved, are `scales`.
    ///
    /// # Panics
    /// If `scales` covers another number of blocks, or a packed value is
    /// out of range.
    pub(crate) fn new(qs: &[Q8], n: usize, nb: usize, scales: S) -> Self {
        let blocks = group_blocks(n, nb);
        let count = blocks.len();
        let want = |bits: &[u32]| if bits.contains(&BITS) { count } else { 0 };
        let mut this = Self {
            n,
            nb,
            qs: Vec::with_capacity(want(&[8])),
            lo: Vec::with_capacity(want(&[6])),
            hi: Vec::with_capacity(want(&[6, 3])),
            top: Vec::with_capacity(want(&[3])),
            scales,
        };
        let blocks = blocks.map(|rows| interleave(rows.map(|i| i.map(|i| &qs[i].0))));
        for q in blocks {
            if BITS == 8 {
                this.qs.push(Q8x8(q));
                continue;
            }
            let u: [u8; 256] = std::array::from_fn(|e| {
                let range = -Self::BIAS..Self::BIAS;
                assert!(
                    range.contains(&q[e]),
                    "{BITS}-bit value {} out of range",
                    q[e]
                );
                (q[e] + Self::BIAS) as u8
            });
            // Byte `32 v + 4 l + t` of `u` is value `4 v + t` of row `l`.
            let (mut nib, mut bits) = ([0u8; 128], [0u8; 32]);
            for v in 0..G {
                for e in 0..32 {
                    let x = u[32 * v + e];
                    if BITS == 6 {
                        nib[32 * (v % 4) + e] |= (x & 0xF) << (4 * (v / 4));
                    } else {
                        bits[e] |= (x >> 2) << v;
                    }
                }
            }
            let shift = if BITS == 6 { 4 } else { 0 };
            this.hi.push(Crumbs8::pack(&u.map(|x| x >> shift)));
            if BITS == 6 {
                this.lo.push(Nib8(nib));
            } else {
                this.top.push(Bits8(bits));
            }
        }
        assert_eq!(this.scales.blocks(), count, "scales of another matrix");
        this
    }

    /// Group blocks stored.
    fn stored(&self) -> usize {
        if BITS == 8 {
            self.qs.len()
        } else {
            self.hi.len()
        }
    }

    /// The eight registers of group block `i`: register `v` holds values
    /// `4 v..4 v + 4` of every row (see the module docs), as `q`; 6-bit
    /// values without `SIGNED` as stored, `q + 32`.
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<const SIGNED: bool>(&self, i: usize) -> [std::arch::x86_64::__m256i; G] {
        use std::arch::x86_64::*;
        if BITS == 8 {
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            return std::array::from_fn(|v| _mm256_load_si256(p.add(v)));
        }
        let bias = _mm256_set1_epi8(Self::BIAS);
        let h = self.hi.as_ptr().add(i) as *const __m256i;
        let (a, b) = (_mm256_load_si256(h), _mm256_load_si256(h.add(1)));
        if BITS == 3 {
            let bit2 = _mm256_set1_epi8(4);
            let t = _mm256_load_si256(self.top.as_ptr().add(i) as *const __m256i);
            // Bit `v` of `t`'s bytes to bit 2: a 16-bit shift moves only
            // the neighbouring byte's other bits across, and the mask drops
            // them (as for the crumbs).
            let low = Crumbs8::regs256(a, b);
            let third = [
                _mm256_slli_epi16::<2>(t),
                _mm256_slli_epi16::<1>(t),
                t,
                _mm256_srli_epi16::<1>(t),
                _mm256_srli_epi16::<2>(t),
                _mm256_srli_epi16::<3>(t),
                _mm256_srli_epi16::<4>(t),
                _mm256_srli_epi16::<5>(t),
            ];
            return std::array::from_fn(|v| {
                let u = _mm256_or_si256(low[v], _mm256_and_si256(third[v], bit2));
                _mm256_sub_epi8(u, bias)
            });
        }
        let low4 = _mm256_set1_epi8(0x0F);
        let top2 = _mm256_set1_epi8(0x30);
        let p = self.lo.as_ptr().add(i) as *const __m256i;
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
        std::array::from_fn(|v| {
            let raw = _mm256_load_si256(p.add(v % 4));
            let low = if v < 4 {
                _mm256_and_si256(raw, low4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low4)
            };
            let u = _mm256_or_si256(low, _mm256_and_si256(top[v], top2));
            if SIGNED {
                _mm256_sub_epi8(u, bias)
            } else {
                u
            }
        })
    }

    /// Blocks `i0` and `i1` as [`Ix8::load`] has them, as the halves of
    /// 512-bit registers, with the bias of [`Group8::SUMS`], unsigned
    /// bytes: the values plus 128 (8-bit) or 32 (6-bit); 3-bit values times
    /// their 16-value scales, plus 127.
    ///
    /// # Safety
    /// AVX-512 F/BW; both blocks exist.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load2_biased(&self, i0: usize, i1: usize) -> [std::arch::x86_64::__m512i; G] {
        use std::arch::x86_64::*;
        if BITS == 8 {
            let p0 = self.qs.as_ptr().add(i0) as *const __m256i;
            let p1 = self.qs.as_ptr().add(i1) as *const __m256i;
            let flip = _mm512_set1_epi8(i8::MIN);
            return std::array::from_fn(|v| {
                _mm512_xor_si512(load_pair(p0.add(v), p1.add(v)), flip)
            });
        }
        let h0 = self.hi.as_ptr().add(i0) as *const __m256i;
        let h1 = self.hi.as_ptr().add(i1) as *const __m256i;
        let (a, b) = (load_pair(h0, h1), load_pair(h0.add(1), h1.add(1)));
        if BITS == 3 {
            // As in `load`, then `p = sc q` (`q = u - 4`) for each row's
            // 16-value scale `sc`, in 16-bit lanes (even and odd bytes
            // apart), stored as `p + 127` (in 3..=255; `p = 128` wraps to
            // the byte -128 and back to 255).
            let bit2 = _mm512_set1_epi8(4);
            let four = _mm512_set1_epi8(4);
            let bias = _mm512_set1_epi8(127);
            let low_bytes = _mm512_set1_epi16(0xFF);
            // Each row's scale in both 16-bit halves of its 32-bit lane.
            // (Loops, not closures: a closure would not inherit the
            // caller's target features, and its intrinsics would be calls.)
            let (s0, s1) = (self.scales.sub_scales(i0), self.scales.sub_scales(i1));
            let mut scale = [_mm512_setzero_si512(); 2];
            for (h, scale) in scale.iter_mut().enumerate() {
                let (c0, c1) = (s0.map_or([1; G], |s| s[h]), s1.map_or([1; G], |s| s[h]));
                let v = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        c0.as_ptr().cast(),
                    ))),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(c1.as_ptr().cast())),
                );
                let low = _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF));
                *scale = _mm512_or_si512(low, _mm512_slli_epi32::<16>(v));
            }
            let t = load_pair(
                self.top.as_ptr().add(i0) as *const __m256i,
                self.top.as_ptr().add(i1) as *const __m256i,
            );
            let third = [
                _mm512_slli_epi16::<2>(t),
                _mm512_slli_epi16::<1>(t),
                t,
                _mm512_srli_epi16::<1>(t),
                _mm512_srli_epi16::<2>(t),
                _mm512_srli_epi16::<3>(t),
                _mm512_srli_epi16::<4>(t),
                _mm512_srli_epi16::<5>(t),
            ];
            let low = Crumbs8::regs512(a, b);
            let mut out = [_mm512_setzero_si512(); G];
            for (v, out) in out.iter_mut().enumerate() {
                let u = _mm512_or_si512(low[v], _mm512_and_si512(third[v], bit2));
                let q = _mm512_sub_epi8(u, four);
                let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(q));
                let odd = _mm512_srai_epi16::<8>(q);
                let sc = scale[v / 4];
                let p = _mm512_or_si512(
                    _mm512_and_si512(_mm512_mullo_epi16(even, sc), low_bytes),
                    _mm512_slli_epi16::<8>(_mm512_mullo_epi16(odd, sc)),
                );
                *out = _mm512_add_epi8(p, bias);
            }
            return out;
        }
        let low4 = _mm512_set1_epi8(0x0F);
        let top2 = _mm512_set1_epi8(0x30);
        let p0 = self.lo.as_ptr().add(i0) as *const __m256i;
        let p1 = self.lo.as_ptr().add(i1) as *const __m256i;
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

impl<S: Scales, const BITS: u32> Group8 for Ix8<S, BITS> {
    const HALVES: bool = S::HALVES;
    /// Q3_K: its values times their integer scales under one factor `d` per
    /// super-block, so a span's sums add up exactly in integers.
    const SPAN256: bool = BITS == 3;
    const AHEAD: usize = match BITS {
        6 => prefetch_blocks::<Nib8>(),
        3 => prefetch_blocks::<Crumbs8>(),
        _ => prefetch_blocks::<Q8x8>(),
    };

    fn rows(&self) -> usize {
        self.n
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        match BITS {
            6 => {
                hint::<HINT, _>(&self.lo, i, 2);
                hint::<HINT, _>(&self.hi, i, 1);
            }
            3 => {
                hint::<HINT, _>(&self.hi, i, 1);
                hint::<HINT, _>(&self.top, i, 1);
            }
            _ => hint::<HINT, _>(&self.qs, i, 4),
        }
        self.scales.prefetch::<HINT>(i);
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        let (v, e) = (j / 4, 4 * l + j % 4);
        let crumb = || self.hi[i].get(l, j);
        match BITS {
            8 => self.qs[i].0[32 * v + e] as i32,
            6 => {
                let low = (self.lo[i].0[32 * (v % 4) + e] >> (4 * (v / 4))) & 0xF;
                (low | (crumb() << 4)) as i32 - 32
            }
            _ => {
                // Times the value's 16-value scale (see `Scales::sub_scales`).
                let third = (self.top[i].0[e] >> v) & 1;
                let sc = self.scales.sub_scales(i).map_or(1, |sc| sc[j / 16][l]);
                ((crumb() | (third << 2)) as i32 - 4) * sc as i32
            }
        }
    }

    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        self.scales.get(i, l, j)
    }

    fn dot(&self, acts: &Acts, g: usize, l: usize, a: usize) -> f32 {
        match self.scales.super_k6() {
            Some((d, sc)) if BITS == 6 && acts.span == 256 => {
                self.dot_span256(d, sc, acts, g, l, a)
            }
            _ => dot_blocks(self, acts, g, l, a),
        }
    }

    /// With `PREFETCH` (a few activation rows: a decode step streaming the
    /// weights from memory), each block asks for the block
    /// [`Group8::AHEAD`] ahead: its values and its scales.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let vnni = VNNI != NO_VNNI;
        if let Some((d, sc)) = self.scales.super_k6() {
            if BITS == 6 && acts.span == 256 {
                return self.tile_span256::<A, VNNI, PREFETCH>(d, sc, acts, g, a);
            }
        }
        if BITS == 8 {
            return self.tile_q8::<A, VNNI, PREFETCH>(acts, g, a);
        }
        let nb = self.nb;
        assert!((g + 1) * nb <= self.stored() && (a + A) * nb <= acts.qs.len());
        let ones = _mm256_set1_epi16(1);
        let offsets = self.scales.has_offset();
        let mut acc = [_mm256_setzero_ps(); A];
        let mut mins = [_mm256_setzero_ps(); A];
        // With `SPAN256`, each row's integer sum of the span so far.
        let mut spans = [_mm256_setzero_si256(); A];
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
            // Q6_K as the stored unsigned bytes, whose sums start from the
            // activations' bias corrections: no `vpabsb` or `vpsignb`; with
            // VNNI one `vpdpbusd` per register, and without it `q + 32` (at
            // most 63) lets two `vpmaddubsw` pairs add in 16 bits (2 * 2 *
            // 63 * 127 = 32004).
            let unsigned = BITS == 6;
            let w = if unsigned {
                self.load::<false>(i)
            } else {
                self.load::<true>(i)
            };
            // `|w|` for the signed paths only.
            let wabs = if unsigned {
                w
            } else {
                w.map(|w| _mm256_abs_epi8(w))
            };
            let [d0, d1] = self.scales.factors_in(span, i);
            // Not `Option::map`: a closure would not inherit the target
            // features, and its intrinsics would be calls.
            #[allow(clippy::manual_map)]
            let sub = match self.scales.sub_scales(i) {
                Some([c0, c1]) => Some([
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(c0.as_ptr().cast())),
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(c1.as_ptr().cast())),
                ]),
                None => None,
            };
            for (j, (acc, span)) in acc.iter_mut().zip(&mut spans).enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                // Values 0..16 and 16..32 summed apart (Q6_K scales each).
                let mut s = [_mm256_setzero_si256(); 2];
                if unsigned && vnni {
                    // Each half's four registers from the half's `-32 sum(x)`.
                    let bias = &*acts.bias.as_ptr().add(ai);
                    for (h, s) in s.iter_mut().enumerate() {
                        *s = _mm256_set1_epi32(bias.halves32[h]);
                        for (k, &wk) in w.iter().enumerate().skip(4 * h).take(4) {
                            *s = dpbusd::<VNNI>(*s, wk, _mm256_set1_epi32(x.add(k).read()));
                        }
                    }
                } else if unsigned {
                    // Each half's four registers as two 16-bit pairs, from
                    // the half's `-32 sum(x)`. (No closures: they would not
                    // inherit the caller's target features.)
                    let bias = &*acts.bias.as_ptr().add(ai);
                    let mut p = [_mm256_setzero_si256(); G];
                    for (k, (p, &wk)) in p.iter_mut().zip(&w).enumerate() {
                        *p = _mm256_maddubs_epi16(wk, _mm256_set1_epi32(x.add(k).read()));
                    }
                    for (h, s) in s.iter_mut().enumerate() {
                        let k = 4 * h;
                        let p0 = _mm256_add_epi16(p[k], p[k + 1]);
                        let p1 = _mm256_add_epi16(p[k + 2], p[k + 3]);
                        let p = _mm256_add_epi32(
                            _mm256_madd_epi16(p0, ones),
                            _mm256_madd_epi16(p1, ones),
                        );
                        *s = _mm256_add_epi32(_mm256_set1_epi32(bias.halves32[h]), p);
                    }
                } else {
                    for (k, (&wk, &wa)) in w.iter().zip(&wabs).enumerate() {
                        let xv = _mm256_set1_epi32(x.add(k).read());
                        let signed = _mm256_sign_epi8(xv, wk);
                        let h = &mut s[k / 4];
                        *h = if vnni {
                            dpbusd::<VNNI>(*h, wa, signed)
                        } else {
                            _mm256_add_epi32(
                                *h,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(wa, signed), ones),
                            )
                        };
                    }
                }
                let dx = _mm256_set1_ps(*acts.d.get_unchecked(ai));
                if S::HALVES {
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[0]), _mm256_mul_ps(d0, dx), *acc);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1]), _mm256_mul_ps(d1, dx), *acc);
                } else {
                    let s = match sub {
                        // Each half's sum times its integer scale: exactly
                        // the sum of the scaled values.
                        Some([c0, c1]) => _mm256_add_epi32(
                            _mm256_mullo_epi32(s[0], c0),
                            _mm256_mullo_epi32(s[1], c1),
                        ),
                        None => _mm256_add_epi32(s[0], s[1]),
                    };
                    if Self::SPAN256 {
                        // One float operation per span (`d` and `d_x` are
                        // the span's).
                        *span = _mm256_add_epi32(*span, s);
                        if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                            let f = _mm256_mul_ps(d0, dx);
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*span), f, *acc);
                            *span = _mm256_setzero_si256();
                        }
                    } else {
                        let f = _mm256_mul_ps(d0, dx);
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), f, *acc);
                    }
                }
            }
            if offsets {
                let mw = self.scales.offsets_in(span, i);
                for (j, mins) in mins.iter_mut().enumerate() {
                    let s = *acts.s.get_unchecked((a + j) * nb + b);
                    *mins = _mm256_fmadd_ps(mw, _mm256_set1_ps(s), *mins);
                }
            }
        }
        std::array::from_fn(|j| _mm256_add_ps(acc[j], mins[j]))
    }

    #[cfg(target_arch = "x86_64")]
    const SUMS: Sums = match (BITS, S::HALVES) {
        (6, true) => Sums::Span6,
        (8, false) => Sums::All128,
        (3, false) => Sums::All127,
        _ => panic!("6-bit values come with a factor per half block, 8- and 3-bit with one"),
    };

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_pair(&self, i0: usize, i1: usize) -> Unpacked {
        use std::arch::x86_64::*;
        if let Some((d, sc)) = self.scales.super_k6() {
            // Q6_K ([`Sums::Span6`]): the super-block's `d`, and each
            // row's two scales as a 16-bit pair (the first half's low). A
            // macro, not a closure: a closure would not inherit the
            // caller's target features.
            macro_rules! pairs {
                ($i:expr) => {{
                    let [c0, c1] = sc.get_unchecked($i);
                    let lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(c0.as_ptr().cast()));
                    let hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(c1.as_ptr().cast()));
                    _mm256_castsi256_ps(_mm256_or_si256(
                        _mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)),
                        _mm256_slli_epi32::<16>(hi),
                    ))
                }};
            }
            return Unpacked {
                w: self.load2_biased(i0, i1),
                d: join_ps(
                    d.get_unchecked(i0 / SPAN_BLOCKS).load(),
                    d.get_unchecked(i1 / SPAN_BLOCKS).load(),
                ),
                m: join_ps(pairs!(i0), pairs!(i1)),
            };
        }
        let [d00, d01] = self.scales.factors(i0);
        let [d10, d11] = self.scales.factors(i1);
        Unpacked {
            w: self.load2_biased(i0, i1),
            d: join_ps(d00, d10),
            m: join_ps(d01, d11),
        }
    }
}
