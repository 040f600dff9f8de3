//! The AVX2 kernel of [`super::I16Matrix`] (tiles of the f32 kernel's
//! shape with integer products) and the rounding of activation rows.

use std::arch::x86_64::*;
use std::ops::Range;

use super::A_MAX;
use crate::f32fma::avx2::{Sink, TileKernel};
use crate::f32fma::MR;

/// The integer kernel's inputs: `a` at the rounded tiles (`tile_len`
/// pairs apart) with one scale per row at `a_scales`; `panel` at the
/// panel's start (64-byte aligned lines of 16 columns x 2 inputs) with
/// its 16 columns' scales at `w_scales`. With `VNNI`, each pair's
/// products add into the sums in one AVX-VNNI `vpdpwssd` (the same exact
/// sums as `vpmaddwd` and `vpaddd`; run through
/// [`crate::f32fma::avx2::block_avxvnni`]).
#[derive(Clone, Copy)]
pub(super) struct I16Tiles<const VNNI: bool> {
    pub a: *const i32,
    pub tile_len: usize,
    pub a_scales: *const f32,
    pub panel: *const i16,
    pub w_scales: *const f32,
}

impl I16Tiles<false> {
    /// The same inputs for the `vpdpwssd` kernel.
    pub(super) fn with_vnni(self) -> I16Tiles<true> {
        let I16Tiles {
            a,
            tile_len,
            a_scales,
            panel,
            w_scales,
        } = self;
        I16Tiles {
            a,
            tile_len,
            a_scales,
            panel,
            w_scales,
        }
    }
}

/// Input pair `p` of a tile: two weight registers, `R` broadcasts of a
/// row's pair, `2 R` `vpmaddwd` and as many adds (not a closure: see the
/// f32 kernel's `step`).
#[inline(always)]
unsafe fn step<const R: usize, const VNNI: bool>(
    acc: &mut [[__m256i; 2]; R],
    t: *const i32,
    p: *const i16,
    pair: usize,
) {
    let b = p.add(pair * 32);
    let w = [
        _mm256_load_si256(b.cast()),
        _mm256_load_si256(b.add(16).cast()),
    ];
    let x = t.add(pair * MR);
    for (i, acc) in acc.iter_mut().enumerate() {
        let xv = _mm256_set1_epi32(x.add(i).read());
        if VNNI {
            acc[0] = _mm256_dpwssd_avx_epi32(acc[0], xv, w[0]);
            acc[1] = _mm256_dpwssd_avx_epi32(acc[1], xv, w[1]);
        } else {
            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(xv, w[0]));
            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(xv, w[1]));
        }
    }
}

impl<const VNNI: bool> TileKernel for I16Tiles<VNNI> {
    /// The pass's integer sums (exact), then `start + sum * w_scale *
    /// a_scale` (a multiply and an FMA).
    #[inline(always)]
    unsafe fn tile<const R: usize, const FULL: bool>(self, r: usize, q: Range<usize>, sink: Sink) {
        let t = self.a.add(r / MR * self.tile_len);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        // One pair per iteration: unrolled, the compiler loads several
        // pairs' weights ahead and spills accumulators. Two pointer
        // increments a pair (a pair's rows side by side): 35 instructions
        // for 12 `vpmaddwd`, which the 6-wide dispatch keeps up with.
        for pair in q.start / 2..q.end.div_ceil(8) * 4 {
            step::<R, VNNI>(&mut acc, t, self.panel, pair);
        }
        let ws = [
            _mm256_loadu_ps(self.w_scales),
            _mm256_loadu_ps(self.w_scales.add(8)),
        ];
        for (i, acc) in acc.iter().enumerate() {
            let sa = _mm256_set1_ps(self.a_scales.add(r + i).read());
            for (h, &v) in acc.iter().enumerate() {
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(v), ws[h]);
                sink.store::<FULL>(i, h, _mm256_fmadd_ps(v, sa, sink.first::<FULL>(i, h)));
            }
        }
    }
}

/// Group `g` of 8 values of a row at `row` (`gs` apart), the last one
/// (`g == groups`) masked.
#[inline(always)]
unsafe fn load_group(row: *const f32, g: usize, groups: usize, gs: usize, mask: __m256i) -> __m256 {
    if g < groups {
        _mm256_loadu_ps(row.add(g * gs))
    } else {
        _mm256_maskload_ps(row.add(g * gs), mask)
    }
}

/// Rounds `rows` rows of `k` values (row `i`'s values `8 g..8 g + 8` at
/// `src + i rs + g gs`) to integers within [`A_MAX`] of one scale per row
/// (into `s`): pairs of i16 in `q`, pair `p` of row `i` at `p MR + i` (a
/// pair's rows side by side, for the kernel's broadcasts); the last
/// group's missing values are 0.
///
/// # Safety
/// The CPU has AVX2 and FMA; the rows lie at `src` as described; `q`
/// holds the tile (`MR` rows of `k` rounded up to 8) and `s` `rows`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_tile(
    src: *const f32,
    rs: usize,
    gs: usize,
    k: usize,
    rows: usize,
    q: &mut [i32],
    s: &mut [f32],
) {
    let (groups, tail) = (k / 8, k % 8);
    assert!(q.len() >= MR * k.div_ceil(8) * 4 && s.len() >= rows && rows <= MR);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail as i32), lane);
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let (lo, hi) = (_mm256_set1_epi32(-A_MAX), _mm256_set1_epi32(A_MAX));
    let all = groups + usize::from(tail > 0);
    let mut inv = [_mm256_setzero_ps(); MR];
    for i in 0..rows {
        let row = src.add(i * rs);
        let mut top = _mm256_setzero_ps();
        for g in 0..all {
            let v = load_group(row, g, groups, gs, mask);
            top = _mm256_max_ps(top, _mm256_and_ps(v, magnitude));
        }
        let top4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps::<1>(top));
        let top2 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
        let top1 = _mm_max_ss(top2, _mm_shuffle_ps::<1>(top2, top2));
        let (scale, row_inv) = super::scale_for(_mm_cvtss_f32(top1), A_MAX);
        s[i] = scale;
        inv[i] = _mm256_set1_ps(row_inv);
    }
    // A group's 4 pairs of each row, then placed pair by pair.
    let mut pairs = [[0i32; 4]; MR];
    for g in 0..all {
        for (i, pairs) in pairs.iter_mut().enumerate().take(rows) {
            let row = src.add(i * rs);
            let v = _mm256_mul_ps(load_group(row, g, groups, gs, mask), inv[i]);
            let n = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);
            // i16 values 0-3 twice in the low half, 4-7 twice in the
            // high; the first copy of each, in order, to the low 128 bits.
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packs_epi32(n, n));
            _mm_storeu_si128(pairs.as_mut_ptr().cast(), _mm256_castsi256_si128(packed));
        }
        let out = &mut q[4 * g * MR..][..4 * MR];
        for (u, out) in out.chunks_exact_mut(MR).enumerate() {
            for (i, v) in out.iter_mut().enumerate().take(rows) {
                *v = pairs[i][u];
            }
        }
    }
}
