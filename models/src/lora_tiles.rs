//! The row kernel of LoRA deltas ([`crate::lora_rows`]) for several rows at
//! once: tiles of a few rows by a few ranks, so that each loaded (and
//! widened) half-precision weight serves every row of the tile and each
//! loaded input value every rank. On 512-bit registers (AVX-512) tiles of
//! up to four rows by four ranks; on 256-bit ones (AVX2) two by two, which
//! keeps a tile's sixteen-lane sums (two registers each), its inputs and a
//! widened weight within the sixteen registers.
//!
//! A row's result is the same bits as the one-row kernels give it: the dot
//! product `A_j x_r` keeps sixteen partial sums, lane `i` taking the values
//! at `i` mod 16 in order (one 512-bit register or two 256-bit ones),
//! summed in lane order, then the tail in order; the update adds `h_j
//! B^T_j` to each output element for the ranks in ascending order with
//! fused multiply-adds. Only the sharing of loads between rows and ranks
//! changes, never the arithmetic of a row.

// A tile's registers are indexed by row and rank, as the arithmetic is
// written; iterators over one of the two would hide the other.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::lora_rows::LowRank;

/// The registers a CPU's tiles run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 512-bit registers: AVX-512F with FMA and F16C.
    Avx512,
    /// 256-bit registers: AVX2 with FMA and F16C.
    Avx2,
}

/// The widest tiles this CPU runs, if any.
pub(crate) fn available() -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        let base = std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c");
        if base && std::is_x86_feature_detected!("avx512f") {
            return Some(Isa::Avx512);
        }
        if base && std::is_x86_feature_detected!("avx2") {
            return Some(Isa::Avx2);
        }
    }
    None
}

/// Every kind of tile this CPU runs (for tests: AVX-512 CPUs run both).
#[cfg(test)]
pub(crate) fn runnable() -> Vec<Isa> {
    match available() {
        Some(Isa::Avx512) => vec![Isa::Avx512, Isa::Avx2],
        Some(Isa::Avx2) => vec![Isa::Avx2],
        None => Vec::new(),
    }
}

/// One register of `N` f32 lanes and the operations the tiles take on it.
///
/// # Safety
/// Every method needs the CPU features of its register type (AVX-512F, or
/// AVX2, FMA and F16C); they are inlined into functions compiled for them.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    const N: usize;
    unsafe fn zero() -> Self;
    /// `N` half-precision values at `p`, widened.
    unsafe fn half(p: *const u16) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn splat(v: f32) -> Self;
    /// `self * b + c`, fused.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m512 {
    const N: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn half(p: *const u16) -> Self {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm512_add_ps(self, b) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m256 {
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn half(p: *const u16) -> Self {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm256_add_ps(self, b) }
    }
}

/// `h[r][t] = scale * A_{j+t} x_{rows[r]}` for the `R` rows and `M` ranks
/// of a tile (`a` points at rank `j`'s row of `A`); the sixteen partial
/// sums of each are `P` registers of `V` (`P * V::N == 16`).
///
/// # Safety
/// `V`'s features; `a` holds `M * k` values; every row of `x` has `k`
/// values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots<V: Lanes, const P: usize, const R: usize, const M: usize>(
    s: &LowRank,
    rows: &[usize; R],
    a: *const u16,
) -> [[f32; M]; R] {
    assert!(P * V::N == 16);
    let k = s.k;
    let k16 = k / 16 * 16;
    let mut xs: [&[f32]; R] = [&[]; R];
    for r in 0..R {
        xs[r] = &s.x[rows[r] * k..(rows[r] + 1) * k];
    }
    // SAFETY (all blocks below): `V`'s features are the caller's.
    let mut acc = [[[unsafe { V::zero() }; P]; M]; R];
    for i in (0..k16).step_by(16) {
        // SAFETY: `i + 16 <= k` for every row of `x` and of `A`.
        unsafe {
            let mut xv = [[V::zero(); P]; R];
            for r in 0..R {
                for p in 0..P {
                    xv[r][p] = V::load(xs[r].as_ptr().add(i + p * V::N));
                }
            }
            for t in 0..M {
                for p in 0..P {
                    let w = V::half(a.add(t * k + i + p * V::N));
                    for r in 0..R {
                        acc[r][t][p] = xv[r][p].fmadd(w, acc[r][t][p]);
                    }
                }
            }
        }
    }
    let mut h = [[0f32; M]; R];
    for r in 0..R {
        for t in 0..M {
            let mut lanes = [0f32; 16];
            // SAFETY: `lanes` holds sixteen values; the row of `A` is in
            // bounds (`M * k` values from `a`).
            let w = unsafe {
                for p in 0..P {
                    acc[r][t][p].store(lanes.as_mut_ptr().add(p * V::N));
                }
                std::slice::from_raw_parts(a.add(t * k), k)
            };
            let mut tail = 0f32;
            for (&x, &w) in xs[r][k16..].iter().zip(&w[k16..]) {
                tail = x.mul_add(half::f16::from_bits(w).to_f32(), tail);
            }
            h[r][t] = s.scale * (lanes.iter().sum::<f32>() + tail);
        }
    }
    h
}

/// `out_o += sum_t h[r][t] B^T_{j+t}` (ranks ascending, fused) for each
/// row `r` of the tile and its output row `o = outs[r]` (`b` points at
/// rank `j`'s row of `B^T`).
///
/// # Safety
/// `V`'s features; `b` holds `M * n` values; the output rows are distinct
/// and in `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn updates<V: Lanes, const R: usize, const M: usize>(
    n: usize,
    h: &[[f32; M]; R],
    b: *const u16,
    out: &mut [f32],
    outs: &[usize; R],
) {
    let nv = n / V::N * V::N;
    for o in outs {
        assert!((o + 1) * n <= out.len());
    }
    // SAFETY (all blocks below): `V`'s features are the caller's.
    let mut hv = [[unsafe { V::zero() }; M]; R];
    for r in 0..R {
        for t in 0..M {
            hv[r][t] = unsafe { V::splat(h[r][t]) };
        }
    }
    let base = out.as_mut_ptr();
    for i in (0..nv).step_by(V::N) {
        // SAFETY: `i + N <= n` for `B^T`'s rows and each output row
        // (checked above).
        unsafe {
            let mut w = [V::zero(); M];
            for t in 0..M {
                w[t] = V::half(b.add(t * n + i));
            }
            for r in 0..R {
                let yp = base.add(outs[r] * n + i);
                let mut y = V::load(yp);
                for t in 0..M {
                    y = w[t].fmadd(hv[r][t], y);
                }
                y.store(yp);
            }
        }
    }
    for r in 0..R {
        let row = &mut out[outs[r] * n..(outs[r] + 1) * n];
        for (e, y) in row.iter_mut().enumerate().skip(nv) {
            for t in 0..M {
                // SAFETY: `e < n`, rank `t` of the tile's `M`.
                let w = unsafe { *b.add(t * n + e) };
                *y = half::f16::from_bits(w).to_f32().mul_add(h[r][t], *y);
            }
        }
    }
}

/// One tile: rows `rows` (output rows `outs`), ranks `j..j + M`.
///
/// # Safety
/// `V`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<V: Lanes, const P: usize, const R: usize, const M: usize>(
    s: &LowRank,
    rows: &[usize; R],
    outs: &[usize; R],
    j: usize,
    out: &mut [f32],
) {
    assert!((j + M) * s.k <= s.a.len() && (j + M) * s.n <= s.bt.len());
    for &r in rows {
        assert!((r + 1) * s.k <= s.x.len());
    }
    // SAFETY: the ranks' rows of `A` and `B^T` and the rows of `x` are
    // checked above; `updates` checks the output rows.
    unsafe {
        let h = dots::<V, P, R, M>(s, rows, s.a.as_ptr().add(j * s.k));
        updates::<V, R, M>(s.n, &h, s.bt.as_ptr().add(j * s.n), out, outs);
    }
}

/// Rows of a tile on `V` registers: four on 512-bit ones (`P == 1`), two
/// on 256-bit ones.
#[cfg(target_arch = "x86_64")]
const fn tile_rows(p: usize) -> usize {
    if p == 1 {
        4
    } else {
        2
    }
}

/// Ranks `j..j + M` for every row, in tiles of [`tile_rows`] rows (then
/// the rest).
///
/// # Safety
/// `V`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn ranks<V: Lanes, const P: usize, const M: usize>(
    s: &LowRank,
    rows: &[usize],
    j: usize,
    out: &mut [f32],
    at: &impl Fn(usize, usize) -> usize,
) {
    let mut i = 0;
    while i < rows.len() {
        let take = (rows.len() - i).min(tile_rows(P));
        let r = |d: usize| rows[i + d];
        let o = |d: usize| at(i + d, rows[i + d]);
        // SAFETY: the caller's features.
        unsafe {
            match take {
                4 => tile::<V, P, 4, M>(
                    s,
                    &[r(0), r(1), r(2), r(3)],
                    &[o(0), o(1), o(2), o(3)],
                    j,
                    out,
                ),
                3 => tile::<V, P, 3, M>(s, &[r(0), r(1), r(2)], &[o(0), o(1), o(2)], j, out),
                2 => tile::<V, P, 2, M>(s, &[r(0), r(1)], &[o(0), o(1)], j, out),
                _ => tile::<V, P, 1, M>(s, &[r(0)], &[o(0)], j, out),
            }
        }
        i += take;
    }
}

/// For each row `r` (the `i`-th of `rows`), output row `at(i, r)` of `out`
/// gets `sum over j in ranks of h_j B^T_j`, `h_j = scale A_j x_r`, in
/// ascending `j` (the same bits as `lora_rows`'s one-row kernels), four
/// ranks and four rows at a time on 512-bit registers. (A decode step's
/// few rows on 256-bit tiles of two by two measured no faster than the
/// one-row kernels, so AVX2 CPUs keep those.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn half_tiled(
    s: &LowRank,
    rows: &[usize],
    ranks_of: std::ops::Range<usize>,
    out: &mut [f32],
    at: impl Fn(usize, usize) -> usize,
) {
    // SAFETY: the features are enabled; `tile` checks the ranks.
    crate::lora_rows::rank_steps!(ranks_of, |j, M| unsafe {
        ranks::<__m512, 1, M>(s, rows, j, out, &at)
    });
}

/// Ranks up to which [`add_tiled`] runs (a tile's `h` is kept on the
/// stack, `MAX_RANK` values per row).
pub(crate) const MAX_RANK: usize = 64;

/// `y += d1 + d2` for the `R` rows of a tile, `d1` the first half of the
/// ranks' `h_j B^T_j` summed from zero in ascending `j` (fused), `d2` the
/// second half's, per output element.
///
/// # Safety
/// `V`'s features; `bt` holds `rank * n` values; the output rows are in
/// `y`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_halves<V: Lanes, const R: usize>(
    s: &LowRank,
    h: &[[f32; MAX_RANK]; R],
    y: &mut [f32],
    outs: &[usize; R],
) {
    let (n, rank, half) = (s.n, s.rank, s.rank / 2);
    let nv = n / V::N * V::N;
    for o in outs {
        assert!((o + 1) * n <= y.len());
    }
    assert!(rank * n <= s.bt.len() && rank <= MAX_RANK);
    let (b, base) = (s.bt.as_ptr(), y.as_mut_ptr());
    for i in (0..nv).step_by(V::N) {
        // SAFETY: `i + N <= n` for every rank's row of `B^T` and each
        // output row (checked above); `V`'s features are the caller's.
        unsafe {
            let mut d1 = [V::zero(); R];
            let mut d2 = [V::zero(); R];
            for j in 0..half {
                let w = V::half(b.add(j * n + i));
                for r in 0..R {
                    d1[r] = w.fmadd(V::splat(h[r][j]), d1[r]);
                }
            }
            for j in half..rank {
                let w = V::half(b.add(j * n + i));
                for r in 0..R {
                    d2[r] = w.fmadd(V::splat(h[r][j]), d2[r]);
                }
            }
            for r in 0..R {
                let yp = base.add(outs[r] * n + i);
                V::load(yp).add(d1[r].add(d2[r])).store(yp);
            }
        }
    }
    for r in 0..R {
        let row = &mut y[outs[r] * n..(outs[r] + 1) * n];
        for (e, y) in row.iter_mut().enumerate().skip(nv) {
            let (mut d1, mut d2) = (0f32, 0f32);
            for j in 0..rank {
                let w = half::f16::from_bits(s.bt[j * n + e]).to_f32();
                if j < half {
                    d1 = w.mul_add(h[r][j], d1);
                } else {
                    d2 = w.mul_add(h[r][j], d2);
                }
            }
            *y += d1 + d2;
        }
    }
}

/// One tile of [`add_tiled`]: every rank's `h` for the `R` rows (in steps
/// of four ranks on 512-bit registers, two on 256-bit ones), then the
/// update of their output rows.
///
/// # Safety
/// `V`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_tile<V: Lanes, const P: usize, const R: usize>(
    s: &LowRank,
    rows: &[usize; R],
    outs: &[usize; R],
    y: &mut [f32],
) {
    let (k, rank) = (s.k, s.rank);
    assert!(rank * k <= s.a.len() && rank <= MAX_RANK);
    for &r in rows {
        assert!((r + 1) * k <= s.x.len());
    }
    let mut h = [[0f32; MAX_RANK]; R];
    let a = s.a.as_ptr();
    // SAFETY (both steps): ranks `j..j + M` are the adapter's (checked
    // above), as are the rows of `x`; the caller's features.
    if P == 1 {
        crate::lora_rows::rank_steps!(0..rank, |j, M| unsafe {
            let d = dots::<V, P, R, M>(s, rows, a.add(j * k));
            for r in 0..R {
                h[r][j..j + M].copy_from_slice(&d[r]);
            }
        });
    } else {
        crate::lora_rows::rank_steps!(2; 0..rank, |j, M| unsafe {
            let d = dots::<V, P, R, M>(s, rows, a.add(j * k));
            for r in 0..R {
                h[r][j..j + M].copy_from_slice(&d[r]);
            }
        });
    }
    // SAFETY: `add_halves` checks the output rows and the weights.
    unsafe { add_halves::<V, R>(s, &h, y, outs) };
}

/// [`add_tiled`] on `V` registers.
///
/// # Safety
/// `V`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_tiles<V: Lanes, const P: usize>(
    s: &LowRank,
    rows: &[usize],
    y: &mut [f32],
    first: usize,
) {
    let mut i = 0;
    while i < rows.len() {
        let take = (rows.len() - i).min(tile_rows(P));
        let r = |d: usize| rows[i + d];
        let o = |d: usize| rows[i + d] - first;
        // SAFETY: the caller's features; `add_tile` checks the rest.
        unsafe {
            match take {
                4 => {
                    add_tile::<V, P, 4>(s, &[r(0), r(1), r(2), r(3)], &[o(0), o(1), o(2), o(3)], y)
                }
                3 => add_tile::<V, P, 3>(s, &[r(0), r(1), r(2)], &[o(0), o(1), o(2)], y),
                2 => add_tile::<V, P, 2>(s, &[r(0), r(1)], &[o(0), o(1)], y),
                _ => add_tile::<V, P, 1>(s, &[r(0)], &[o(0)], y),
            }
        }
        i += take;
    }
}

/// `y_{r - first} += B (scale A x_r)` for each row `r` of `rows`, straight
/// onto `y` in one pass: the same bits as the scratch path of
/// `lora_rows` (each rank half summed from zero, the halves added, the
/// sum added to `y`), in tiles of rows on `isa`'s registers. Ranks up to
/// [`MAX_RANK`].
///
/// # Safety
/// The CPU runs `isa`'s tiles ([`available`]).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn add_tiled(isa: Isa, s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn wide(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
        // SAFETY: the features are enabled.
        unsafe { add_tiles::<__m512, 1>(s, rows, y, first) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    fn narrow(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
        // SAFETY: the features are enabled.
        unsafe { add_tiles::<__m256, 2>(s, rows, y, first) }
    }
    // SAFETY: the caller's CPU runs `isa`.
    unsafe {
        match isa {
            Isa::Avx512 => wide(s, rows, y, first),
            Isa::Avx2 => narrow(s, rows, y, first),
        }
    }
}
