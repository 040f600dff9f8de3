//! The row kernel of LoRA deltas ([`crate::lora_rows`]) for several rows at
//! once on 512-bit registers: tiles of up to four rows by up to four ranks,
//! so that each loaded (and widened) half-precision weight serves every row
//! of the tile and each loaded input value every rank.
//!
//! A row's result is the same bits as the one-row kernels give it: the dot
//! product `A_j x_r` keeps sixteen partial sums, lane `i` taking the values
//! at `i` mod 16 in order (one 512-bit register holds what the 256-bit
//! kernels keep in two), summed in lane order, then the tail in order; the
//! update adds `h_j B^T_j` to each output element for the ranks in
//! ascending order with fused multiply-adds. Only the sharing of loads
//! between rows and ranks changes, never the arithmetic of a row.

// A tile's registers are indexed by row and rank, as the arithmetic is
// written; iterators over one of the two would hide the other.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::lora_rows::{rank_steps, LowRank};

/// Whether this CPU runs [`half_tiled`] (AVX-512F with FMA and F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// Sixteen half-precision values at `p` as f32.
///
/// # Safety
/// AVX-512F; 16 values readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load16(p: *const u16) -> __m512 {
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

/// `h[r][t] = scale * A_{j+t} x_{rows[r]}` for the `R` rows and `M` ranks
/// of a tile (`a` points at rank `j`'s row of `A`).
///
/// # Safety
/// AVX-512F; `a` holds `M * k` values; every row of `x` has `k` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots<const R: usize, const M: usize>(
    s: &LowRank,
    rows: &[usize; R],
    a: *const u16,
) -> [[f32; M]; R] {
    let k = s.k;
    let k16 = k / 16 * 16;
    let xs: [&[f32]; R] = std::array::from_fn(|r| &s.x[rows[r] * k..(rows[r] + 1) * k]);
    let mut acc = [[_mm512_setzero_ps(); M]; R];
    for i in (0..k16).step_by(16) {
        // SAFETY: `i + 16 <= k` for every row of `x` and of `A`.
        unsafe {
            let xv: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(xs[r].as_ptr().add(i)));
            for t in 0..M {
                let w = load16(a.add(t * k + i));
                for r in 0..R {
                    acc[r][t] = _mm512_fmadd_ps(xv[r], w, acc[r][t]);
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
                _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][t]);
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
/// AVX-512F; `b` holds `M * n` values; the output rows are distinct and in
/// `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn updates<const R: usize, const M: usize>(
    n: usize,
    h: &[[f32; M]; R],
    b: *const u16,
    out: &mut [f32],
    outs: &[usize; R],
) {
    let n16 = n / 16 * 16;
    for o in outs {
        assert!((o + 1) * n <= out.len());
    }
    let hv: [[__m512; M]; R] =
        std::array::from_fn(|r| std::array::from_fn(|t| _mm512_set1_ps(h[r][t])));
    let base = out.as_mut_ptr();
    for i in (0..n16).step_by(16) {
        // SAFETY: `i + 16 <= n` for `B^T`'s rows and each output row
        // (checked above).
        unsafe {
            let w: [__m512; M] = std::array::from_fn(|t| load16(b.add(t * n + i)));
            for r in 0..R {
                let yp = base.add(outs[r] * n + i);
                let mut y = _mm512_loadu_ps(yp);
                for t in 0..M {
                    y = _mm512_fmadd_ps(w[t], hv[r][t], y);
                }
                _mm512_storeu_ps(yp, y);
            }
        }
    }
    for r in 0..R {
        let row = &mut out[outs[r] * n..(outs[r] + 1) * n];
        for (e, y) in row.iter_mut().enumerate().skip(n16) {
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
/// AVX-512F, FMA, F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<const R: usize, const M: usize>(
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
        let h = dots::<R, M>(s, rows, s.a.as_ptr().add(j * s.k));
        updates::<R, M>(s.n, &h, s.bt.as_ptr().add(j * s.n), out, outs);
    }
}

/// Ranks `j..j + M` for every row, in tiles of four rows (then the rest).
///
/// # Safety
/// AVX-512F, FMA, F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn ranks<const M: usize>(
    s: &LowRank,
    rows: &[usize],
    j: usize,
    out: &mut [f32],
    at: &impl Fn(usize, usize) -> usize,
) {
    let mut i = 0;
    while i < rows.len() {
        let take = (rows.len() - i).min(4);
        let r = |d: usize| rows[i + d];
        let o = |d: usize| at(i + d, rows[i + d]);
        // SAFETY: the caller's features.
        unsafe {
            match take {
                4 => tile::<4, M>(
                    s,
                    &[r(0), r(1), r(2), r(3)],
                    &[o(0), o(1), o(2), o(3)],
                    j,
                    out,
                ),
                3 => tile::<3, M>(s, &[r(0), r(1), r(2)], &[o(0), o(1), o(2)], j, out),
                2 => tile::<2, M>(s, &[r(0), r(1)], &[o(0), o(1)], j, out),
                _ => tile::<1, M>(s, &[r(0)], &[o(0)], j, out),
            }
        }
        i += take;
    }
}

/// For each row `r` (the `i`-th of `rows`), output row `at(i, r)` of `out`
/// gets `sum over j in ranks of h_j B^T_j`, `h_j = scale A_j x_r`, in
/// ascending `j` (the same bits as `lora_rows`'s one-row kernels), four
/// ranks and four rows at a time.
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
    rank_steps!(ranks_of, |j, M| unsafe { ranks::<M>(s, rows, j, out, &at) });
}

/// Ranks up to which [`add_tiled`] runs (a tile's `h` is kept on the
/// stack, `MAX_RANK` values per row).
pub(crate) const MAX_RANK: usize = 64;

/// `y += d1 + d2` for the `R` rows of a tile, `d1` the first half of the
/// ranks' `h_j B^T_j` summed from zero in ascending `j` (fused), `d2` the
/// second half's, per output element.
///
/// # Safety
/// AVX-512F; `bt` holds `rank * n` values; the output rows are in `y`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_halves<const R: usize>(
    s: &LowRank,
    h: &[[f32; MAX_RANK]; R],
    y: &mut [f32],
    outs: &[usize; R],
) {
    let (n, rank, half) = (s.n, s.rank, s.rank / 2);
    let n16 = n / 16 * 16;
    for o in outs {
        assert!((o + 1) * n <= y.len());
    }
    assert!(rank * n <= s.bt.len() && rank <= MAX_RANK);
    let (b, base) = (s.bt.as_ptr(), y.as_mut_ptr());
    for i in (0..n16).step_by(16) {
        // SAFETY: `i + 16 <= n` for every rank's row of `B^T` and each
        // output row (checked above).
        unsafe {
            let mut d1 = [_mm512_setzero_ps(); R];
            let mut d2 = [_mm512_setzero_ps(); R];
            for j in 0..half {
                let w = load16(b.add(j * n + i));
                for r in 0..R {
                    d1[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(h[r][j]), d1[r]);
                }
            }
            for j in half..rank {
                let w = load16(b.add(j * n + i));
                for r in 0..R {
                    d2[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(h[r][j]), d2[r]);
                }
            }
            for r in 0..R {
                let yp = base.add(outs[r] * n + i);
                let d = _mm512_add_ps(d1[r], d2[r]);
                _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), d));
            }
        }
    }
    for r in 0..R {
        let row = &mut y[outs[r] * n..(outs[r] + 1) * n];
        for (e, y) in row.iter_mut().enumerate().skip(n16) {
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

/// One tile of [`add_tiled`]: every rank's `h` for the `R` rows, then the
/// update of their output rows.
///
/// # Safety
/// AVX-512F, FMA, F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_tile<const R: usize>(
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
    // SAFETY: ranks `j..j + M` are the adapter's (checked above), as are
    // the rows of `x`.
    rank_steps!(0..rank, |j, M| unsafe {
        let d = dots::<R, M>(s, rows, a.add(j * k));
        for r in 0..R {
            h[r][j..j + M].copy_from_slice(&d[r]);
        }
    });
    // SAFETY: `add_halves` checks the output rows and the weights.
    unsafe { add_halves::<R>(s, &h, y, outs) };
}

/// `y_{r - first} += B (scale A x_r)` for each row `r` of `rows`, straight
/// onto `y` in one pass: the same bits as the scratch path of
/// `lora_rows` (each rank half summed from zero, the halves added, the
/// sum added to `y`), four rows at a time. Ranks up to [`MAX_RANK`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn add_tiled(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    let mut i = 0;
    while i < rows.len() {
        let take = (rows.len() - i).min(4);
        let r = |d: usize| rows[i + d];
        let o = |d: usize| rows[i + d] - first;
        // SAFETY: the features are enabled; `add_tile` checks the rest.
        unsafe {
            match take {
                4 => add_tile::<4>(s, &[r(0), r(1), r(2), r(3)], &[o(0), o(1), o(2), o(3)], y),
                3 => add_tile::<3>(s, &[r(0), r(1), r(2)], &[o(0), o(1), o(2)], y),
                2 => add_tile::<2>(s, &[r(0), r(1)], &[o(0), o(1)], y),
                _ => add_tile::<1>(s, &[r(0)], &[o(0)], y),
            }
        }
        i += take;
    }
}
