//! The scales (and offsets) of an interleaved matrix's group blocks.
//!
//! A group block (eight rows x 32 values, see the parent module) needs, per
//! row, the factor of its integer values and the offset added per weight.
//! The formats keep these differently, and the kernels are generic over
//! [`Scales`], so each layout keeps the GGUF's own precision and size:
//!
//! - [`Flat`] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): an f16 scale and optionally
//!   an f16 offset per row and block;
//! - [`SuperK4`] (Q4_K, Q5_K): per 256 values an f16 `d` and `dmin` per row, per
//!   32 a 6-bit scale `sc` and min `mn`: factor `d sc`, offset `-dmin mn`;
//! - [`SuperK6`] (Q6_K): per 256 an f16 `d` per row, per 16 a signed 8-bit
//!   scale: factor `d sc` for values 0..16 and another for 16..32 of each
//!   block ([`Scales::HALVES`]), no offset;
//! - [`SuperK3`] (Q3_K): the same numbers, but the layout multiplies its
//!   values by the 16-value scales (integers, [`Scales::sub_scales`]), so
//!   the factor is `d` alone (both are [`Super16`]).
//!
//! Every factor is exact in f32 (an f16 times at most 8 bits), so the
//! kernels reproduce the GGUF weights exactly.

#[cfg(target_arch = "x86_64")]
use super::hint;
use super::{Half8, G};

/// Per-row factors and offsets of the group blocks of one matrix; block `i`
/// is block `i % nb` of group `i / nb` (`nb` blocks per row).
pub(crate) trait Scales: Send + Sync + std::fmt::Debug {
    /// Whether values 16..32 of a block have a factor of their own.
    const HALVES: bool;

    /// Group blocks covered.
    fn blocks(&self) -> usize;

    /// Whether the weights have offsets.
    fn has_offset(&self) -> bool;

    /// Factor of value `j` (0..32) of row `l` of block `i`, and the row's
    /// offset there (0 without offsets).
    fn get(&self, i: usize, l: usize, j: usize) -> (f32, f32);

    /// Consecutive blocks that share a super-block's scales (`d`, `dmin`):
    /// 8 for the K-quants, 1 for the flat ones. The kernels that walk a
    /// row's blocks in order load those once per span ([`Scales::span`])
    /// and ask for the scales of a whole span at once
    /// ([`Scales::prefetch`]).
    const SPAN: usize;

    /// What the blocks of a span share, loaded once per span.
    #[cfg(target_arch = "x86_64")]
    type Span: Copy;

    /// The shared part of block `i`'s span.
    ///
    /// # Safety
    /// AVX2 and F16C; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    unsafe fn span(&self, i: usize) -> Self::Span;

    /// The eight rows' factors of block `i`, whose span's shared part is
    /// `span`, as f32 lanes: values 0..16 and 16..32 (the same unless
    /// [`Scales::HALVES`]).
    ///
    /// # Safety
    /// As [`Scales::span`]; `span` is block `i`'s.
    #[cfg(target_arch = "x86_64")]
    unsafe fn factors_in(&self, span: Self::Span, i: usize) -> [std::arch::x86_64::__m256; 2];

    /// The eight rows' offsets of block `i` (only called with offsets),
    /// whose span's shared part is `span`.
    ///
    /// # Safety
    /// As [`Scales::factors_in`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn offsets_in(&self, span: Self::Span, i: usize) -> std::arch::x86_64::__m256;

    /// [`Scales::factors_in`] with block `i`'s span loaded for it.
    ///
    /// # Safety
    /// As [`Scales::span`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn factors(&self, i: usize) -> [std::arch::x86_64::__m256; 2] {
        self.factors_in(self.span(i), i)
    }

    /// [`Scales::offsets_in`] with block `i`'s span loaded for it.
    ///
    /// # Safety
    /// As [`Scales::span`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn offsets(&self, i: usize) -> std::arch::x86_64::__m256 {
        self.offsets_in(self.span(i), i)
    }

    /// Asks for the scales of the span that block `i` starts into the
    /// cache `HINT` names; nothing where `i` does not start a span (a
    /// hint; any `i`). Asked for per block instead, each 64-byte line of
    /// 8-byte scales would be asked for eight times.
    #[cfg(target_arch = "x86_64")]
    fn prefetch<const HINT: i32>(&self, i: usize);

    /// The integer scales by which the layout multiplies the values of
    /// block `i`, per row for values 0..16 and 16..32, if any.
    fn sub_scales(&self, _i: usize) -> Option<&[[i8; G]; 2]> {
        None
    }

    /// The K-quant super-block scales of Q4_K and Q5_K, for their kernels
    /// over activations with one scale per 256 values.
    fn super_k4(&self) -> Option<&SuperK4> {
        None
    }

    /// Q6_K's `d` per super-block and signed 16-value scales per block, for
    /// its kernels over activations with one scale per 256 values.
    #[allow(clippy::type_complexity)]
    fn super_k6(&self) -> Option<(&[Half8], &[[[i8; G]; 2]])> {
        None
    }
}

/// An f16 scale and optional offset per row and block.
#[derive(Debug, Default)]
pub(crate) struct Flat {
    pub d: Vec<Half8>,
    pub m: Option<Vec<Half8>>,
}

impl Scales for Flat {
    const HALVES: bool = false;
    const SPAN: usize = 1;
    #[cfg(target_arch = "x86_64")]
    type Span = ();

    fn blocks(&self) -> usize {
        self.d.len()
    }

    fn has_offset(&self) -> bool {
        self.m.is_some()
    }

    fn get(&self, i: usize, l: usize, _j: usize) -> (f32, f32) {
        (
            self.d[i].get(l),
            self.m.as_ref().map_or(0.0, |m| m[i].get(l)),
        )
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn span(&self, _i: usize) {}

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn factors_in(&self, _: (), i: usize) -> [std::arch::x86_64::__m256; 2] {
        let d = self.d.get_unchecked(i).load();
        [d, d]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn offsets_in(&self, _: (), i: usize) -> std::arch::x86_64::__m256 {
        match &self.m {
            Some(m) => m.get_unchecked(i).load(),
            None => std::arch::x86_64::_mm256_setzero_ps(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        hint::<HINT, _>(&self.d, i, 1);
        if let Some(m) = &self.m {
            hint::<HINT, _>(m, i, 1);
        }
    }
}

/// Q4_K: `d`, `dmin` per row and super-block (block `i`'s at `i / 8`),
/// 6-bit `sc`, `mn` per row and block.
#[derive(Debug, Default)]
pub(crate) struct SuperK4 {
    pub d: Vec<Half8>,
    pub dmin: Vec<Half8>,
    pub sc: Vec<[u8; G]>,
    pub mn: Vec<[u8; G]>,
}

/// Eight bytes widened to i32 lanes, then f32.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn u8_lanes(b: &[u8; G]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast())))
}

/// As [`u8_lanes`], signed.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn i8_lanes(b: &[i8; G]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast())))
}

impl Scales for SuperK4 {
    const HALVES: bool = false;
    const SPAN: usize = G;
    /// `d` and `dmin`.
    #[cfg(target_arch = "x86_64")]
    type Span = [std::arch::x86_64::__m256; 2];

    fn blocks(&self) -> usize {
        self.sc.len()
    }

    fn has_offset(&self) -> bool {
        true
    }

    fn get(&self, i: usize, l: usize, _j: usize) -> (f32, f32) {
        let t = i / G;
        (
            self.d[t].get(l) * self.sc[i][l] as f32,
            -(self.dmin[t].get(l) * self.mn[i][l] as f32),
        )
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn span(&self, i: usize) -> Self::Span {
        [
            self.d.get_unchecked(i / G).load(),
            self.dmin.get_unchecked(i / G).load(),
        ]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn factors_in(&self, [d, _]: Self::Span, i: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        let d = _mm256_mul_ps(d, u8_lanes(self.sc.get_unchecked(i)));
        [d, d]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn offsets_in(&self, [_, dmin]: Self::Span, i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let m = _mm256_mul_ps(dmin, u8_lanes(self.mn.get_unchecked(i)));
        _mm256_sub_ps(_mm256_setzero_ps(), m)
    }

    /// A span's 64 bytes of `sc` and of `mn` (two lines each, at any
    /// alignment) and its `d` and `dmin`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        if !i.is_multiple_of(G) {
            return;
        }
        hint::<HINT, _>(&self.sc, i, 2);
        hint::<HINT, _>(&self.mn, i, 2);
        hint::<HINT, _>(&self.d, i / G, 1);
        hint::<HINT, _>(&self.dmin, i / G, 1);
    }

    #[inline(always)]
    fn super_k4(&self) -> Option<&SuperK4> {
        Some(self)
    }
}

/// Q6_K and Q3_K: `d` per row and super-block (block `i`'s at `i / 8`),
/// a signed scale per row and 16 values: `sc[i][h]` for half `h` of block
/// `i`. Without `INTEGER` (Q6_K) the factors are `d sc`, one per half
/// ([`Scales::HALVES`]); with it (Q3_K) the layout multiplies its values
/// by the `sc` ([`Scales::sub_scales`]) and the factor is `d`.
#[derive(Debug, Default)]
pub(crate) struct Super16<const INTEGER: bool> {
    pub d: Vec<Half8>,
    pub sc: Vec<[[i8; G]; 2]>,
}

/// Q6_K's scales.
pub(crate) type SuperK6 = Super16<false>;
/// Q3_K's scales.
pub(crate) type SuperK3 = Super16<true>;

impl<const INTEGER: bool> Scales for Super16<INTEGER> {
    const HALVES: bool = !INTEGER;
    const SPAN: usize = G;
    /// `d`.
    #[cfg(target_arch = "x86_64")]
    type Span = std::arch::x86_64::__m256;

    fn blocks(&self) -> usize {
        self.sc.len()
    }

    fn has_offset(&self) -> bool {
        false
    }

    fn get(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        let d = self.d[i / G].get(l);
        if INTEGER {
            (d, 0.0)
        } else {
            (d * self.sc[i][j / 16][l] as f32, 0.0)
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn span(&self, i: usize) -> Self::Span {
        self.d.get_unchecked(i / G).load()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn factors_in(&self, d: Self::Span, i: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        if INTEGER {
            return [d, d];
        }
        let sc = self.sc.get_unchecked(i);
        [
            _mm256_mul_ps(d, i8_lanes(&sc[0])),
            _mm256_mul_ps(d, i8_lanes(&sc[1])),
        ]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn offsets_in(&self, _: Self::Span, _i: usize) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_setzero_ps()
    }

    /// A span's 128 bytes of `sc` (two or three lines) and its `d`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        if !i.is_multiple_of(G) {
            return;
        }
        hint::<HINT, _>(&self.sc, i, 3);
        hint::<HINT, _>(&self.d, i / G, 1);
    }

    #[inline(always)]
    fn super_k6(&self) -> Option<(&[Half8], &[[[i8; G]; 2]])> {
        (!INTEGER).then_some((&self.d, &self.sc))
    }

    #[inline(always)]
    fn sub_scales(&self, i: usize) -> Option<&[[i8; G]; 2]> {
        if INTEGER {
            self.sc.get(i)
        } else {
            None
        }
    }
}
