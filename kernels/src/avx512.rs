//! AVX-512 (F, BW, VL; optionally VNNI) kernels.
//!
//! The arithmetic of `avx2.rs` on two 32-value blocks per 512-bit register:
//! the activation blocks `b`, `b + 1` are 64 consecutive bytes; the weight
//! blocks are widened to the same order (for U4: low and high nibbles of
//! both blocks, then the 128-bit lanes reordered to `b` low, `b` high,
//! `b + 1` low, `b + 1` high). The byte products are summed per 4 into 16
//! i32 lanes, lanes 0..8 for block `b` and 8..16 for `b + 1`, by
//! `vpdpbusd` with VNNI or `vpmaddubsw` + `vpmaddwd` without. The scales are
//! spread to match with one `vpermps` (`[d_b x 8, d_b+1 x 8]`). An odd last
//! block runs alone with the
//! other half zero (zero weights and zero scales add nothing).
//!
//! Signed weights (I8) use `|w|` and `x` negated where `w < 0` (AVX-512 has
//! no `vpsignb`; a masked subtraction from zero does it).
//!
//! These paths could not be run on the development machine (no AVX-512);
//! the tests in `tests/matmul.rs` cover them wherever the CPU has it, and
//! [`crate::Isa::best`] only picks them when `HEARTH_KERNELS_AVX512=1`.

use std::arch::x86_64::*;

use crate::act::Acts;
use crate::avx2::dot_mins;
use crate::formats::{I8, U4};
use crate::Tile;

pub(crate) struct U4Tile<'a> {
    w: &'a U4,
    acts: &'a Acts,
    vnni: bool,
}

pub(crate) struct I8Tile<'a> {
    w: &'a I8,
    acts: &'a Acts,
    vnni: bool,
}

impl<'a> U4Tile<'a> {
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA, and VNNI if
    /// `vnni`.
    pub(crate) unsafe fn new(w: &'a U4, acts: &'a Acts, vnni: bool) -> Self {
        Self { w, acts, vnni }
    }
}

impl<'a> I8Tile<'a> {
    /// # Safety
    /// As [`U4Tile::new`].
    pub(crate) unsafe fn new(w: &'a I8, acts: &'a Acts, vnni: bool) -> Self {
        Self { w, acts, vnni }
    }
}

/// Sums of 4 adjacent u8 x i8 products into 16 i32 lanes.
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(w: __m512i, x: __m512i) -> __m512i {
    if VNNI {
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x)
    } else {
        _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1))
    }
}

/// Scales `p[0]` (and `p[1]` unless `single`) spread to `[p0 x 8, p1 x 8]`.
#[inline(always)]
unsafe fn spread2(p: *const f32, single: bool) -> __m512 {
    let v = if single {
        _mm_load_ss(p)
    } else {
        _mm_castpd_ps(_mm_load_sd(p as *const f64))
    };
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// 64 bytes at `p` (32 and zeros if `single`).
#[inline(always)]
unsafe fn load_bytes(p: *const u8, single: bool) -> __m512i {
    if single {
        _mm512_inserti64x4(
            _mm512_setzero_si512(),
            _mm256_loadu_si256(p as *const __m256i),
            0,
        )
    } else {
        _mm512_loadu_si512(p as *const __m512i)
    }
}

/// The 4-bit values of blocks at `p` (one if `single`) widened to bytes in
/// value order.
#[inline(always)]
unsafe fn u4_values(p: *const u8, single: bool) -> __m512i {
    let raw = if single {
        _mm256_set_m128i(_mm_setzero_si128(), _mm_loadu_si128(p as *const __m128i))
    } else {
        _mm256_loadu_si256(p as *const __m256i)
    };
    let low4 = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(raw, low4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    // Lanes [b lo, b+1 lo, b hi, b+1 hi] -> [b lo, b hi, b+1 lo, b+1 hi].
    let v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    _mm512_shuffle_i64x2(v, v, 0b11_01_10_00)
}

#[inline(always)]
unsafe fn u4_body<const R: usize, const A: usize, const VNNI: bool>(
    w: &U4,
    acts: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    let nb = w.nb;
    assert!(acts.nb == nb && (r + R) * nb <= w.qs.len() && (a + A) * nb <= acts.qs.len());
    let (wq, wd) = (w.qs.as_ptr().add(r * nb), w.d.as_ptr().add(r * nb));
    let (aq, ad) = (acts.qs.as_ptr().add(a * nb), acts.d.as_ptr().add(a * nb));
    let mut acc = [[_mm512_setzero_ps(); A]; R];
    let mut b = 0;
    while b < nb {
        let single = b + 1 == nb;
        for (i, acc) in acc.iter_mut().enumerate() {
            let wv = u4_values(wq.add(i * nb + b) as *const u8, single);
            let dw = spread2(wd.add(i * nb + b), single);
            for (j, acc) in acc.iter_mut().enumerate() {
                let xv = load_bytes(aq.add(j * nb + b) as *const u8, single);
                let p = dot4::<VNNI>(wv, xv);
                let scale = _mm512_mul_ps(dw, spread2(ad.add(j * nb + b), single));
                *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), *acc);
            }
        }
        b += 2;
    }
    let mut out = [[0f32; A]; R];
    for i in 0..R {
        let wm = &w.m[(r + i) * nb..(r + i + 1) * nb];
        for j in 0..A {
            let s = &acts.s[(a + j) * nb..(a + j + 1) * nb];
            out[i][j] = _mm512_reduce_add_ps(acc[i][j]) + dot_mins(wm, s);
        }
    }
    out
}

#[inline(always)]
unsafe fn i8_body<const R: usize, const A: usize, const VNNI: bool>(
    w: &I8,
    acts: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    let nb = w.nb;
    assert!(acts.nb == nb && (r + R) * nb <= w.qs.len() && (a + A) * nb <= acts.qs.len());
    let (wq, wd) = (w.qs.as_ptr().add(r * nb), w.d.as_ptr().add(r * nb));
    let (aq, ad) = (acts.qs.as_ptr().add(a * nb), acts.d.as_ptr().add(a * nb));
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); A]; R];
    let mut b = 0;
    while b < nb {
        let single = b + 1 == nb;
        for (i, acc) in acc.iter_mut().enumerate() {
            let wv = load_bytes(wq.add(i * nb + b) as *const u8, single);
            let wabs = _mm512_abs_epi8(wv);
            let neg = _mm512_movepi8_mask(wv);
            let sc = spread2(wd.add(i * nb + b), single);
            for (j, acc) in acc.iter_mut().enumerate() {
                let xv = load_bytes(aq.add(j * nb + b) as *const u8, single);
                let signed = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                let p = dot4::<VNNI>(wabs, signed);
                let scale = _mm512_mul_ps(sc, spread2(ad.add(j * nb + b), single));
                *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), *acc);
            }
        }
        b += 2;
    }
    let mut out = [[0f32; A]; R];
    for i in 0..R {
        for j in 0..A {
            out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
            if let Some(m) = &w.m {
                let wm = &m[(r + i) * nb..(r + i + 1) * nb];
                out[i][j] += dot_mins(wm, &acts.s[(a + j) * nb..(a + j + 1) * nb]);
            }
        }
    }
    out
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn u4_tile<const R: usize, const A: usize>(
    w: &U4,
    x: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    u4_body::<R, A, false>(w, x, r, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn u4_tile_vnni<const R: usize, const A: usize>(
    w: &U4,
    x: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    u4_body::<R, A, true>(w, x, r, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn i8_tile<const R: usize, const A: usize>(
    w: &I8,
    x: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    i8_body::<R, A, false>(w, x, r, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn i8_tile_vnni<const R: usize, const A: usize>(
    w: &I8,
    x: &Acts,
    r: usize,
    a: usize,
) -> [[f32; A]; R] {
    i8_body::<R, A, true>(w, x, r, a)
}

impl Tile for U4Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        // SAFETY: `new`'s contract; bounds asserted inside.
        unsafe {
            if self.vnni {
                u4_tile_vnni::<R, A>(self.w, self.acts, r, a)
            } else {
                u4_tile::<R, A>(self.w, self.acts, r, a)
            }
        }
    }
}

impl Tile for I8Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        // SAFETY: as for `U4Tile`.
        unsafe {
            if self.vnni {
                i8_tile_vnni::<R, A>(self.w, self.acts, r, a)
            } else {
                i8_tile::<R, A>(self.w, self.acts, r, a)
            }
        }
    }
}
