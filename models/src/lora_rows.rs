//! The CPU row kernel of LoRA deltas: `y_r += scale * B (A x_r)` for the
//! rows of one adapter group, each row computed in one fixed order whatever
//! else is in the batch ([`low_rank_rows`]).

use candle_core::Result;

/// `body` for ranks `ranks` in steps of up to four (or, written
/// `rank_steps!(2; ..)`, two): `$j` the step's first rank, `$m` its number
/// of ranks as a constant (4 or 2, then what is left).
macro_rules! rank_steps {
    (2; $ranks:expr, |$j:ident, $m:ident| $body:expr) => {{
        let ranks: std::ops::Range<usize> = $ranks;
        let mut $j = ranks.start;
        while $j < ranks.end {
            $j += if ranks.end - $j >= 2 {
                const $m: usize = 2;
                $body;
                2
            } else {
                const $m: usize = 1;
                $body;
                1
            };
        }
    }};
    ($ranks:expr, |$j:ident, $m:ident| $body:expr) => {{
        let ranks: std::ops::Range<usize> = $ranks;
        let mut $j = ranks.start;
        while $j < ranks.end {
            $j += match ranks.end - $j {
                4.. => {
                    const $m: usize = 4;
                    $body;
                    4
                }
                3 => {
                    const $m: usize = 3;
                    $body;
                    3
                }
                2 => {
                    const $m: usize = 2;
                    $body;
                    2
                }
                _ => {
                    const $m: usize = 1;
                    $body;
                    1
                }
            };
        }
    }};
}
pub(crate) use rank_steps;

/// One adapted projection's inputs: `A` (`a`, `[rank, k]`), `B`
/// transposed (`bt`, `[rank, n]`), both half-precision bits, the scale,
/// and the batch's input rows `x` (rows of `k`).
pub(crate) struct LowRank<'a> {
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) rank: usize,
    pub(crate) scale: f32,
    pub(crate) x: &'a [f32],
    pub(crate) a: &'a [u16],
    pub(crate) bt: &'a [u16],
}

/// `y_r += B (scale A x_r)` for each row `r` of `rows` (`x` rows of `k`,
/// `y` rows of `n`; `bt` is `B` transposed, `[rank, n]`). Each row `j` of
/// `A` and of `B^T` is widened from half precision once per call and used
/// for every row of it; the `A` products are 16-way split dot products; the
/// `B` product adds `h_j` times row `j` of `B^T` to the output (contiguous,
/// so it vectorises, where a dot product of `rank` terms per output is a
/// chain of dependent adds). Compiled for AVX2 + FMA where the CPU has them.
///
/// Every row is computed in one fixed order, whatever the call: the first
/// half of the rank (`j < rank / 2`) is added onto `y_r`, the second half
/// summed from zero apart, and that sum added last. The halves can then run
/// on two threads (a few rows: a decode step's) with the same result as one
/// thread (one row, or many rows shared between threads by rows), so a
/// row's result depends only on that row, never on the rest of the batch.
pub(crate) fn low_rank_rows(s: &LowRank, rows: &[usize], y: &mut [f32]) -> Result<()> {
    check_fits(s, rows, y)?;
    let (k, n, rank) = (s.k, s.n, s.rank);
    let sorted = rows.windows(2).all(|w| w[0] < w[1]);
    let work = rows.len() * rank * (k + n);
    if rows.len() >= PARALLEL_ROWS && sorted {
        split_rows(s, rows, y, 0);
    } else if rows.len() >= 2
        && work >= PARALLEL_RANK_WORK
        && rank >= 2
        && rayon::current_num_threads() > 1
    {
        split_rank(s, rows, y);
    } else if let [r] = rows {
        one_row(s, *r, y);
    } else {
        both_halves(s, rows, y, 0);
    }
    Ok(())
}

/// One row, both halves, in the fixed order.
fn one_row(s: &LowRank, r: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::vecmath::has_fma() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        unsafe { fused::one_row(s, r, y) };
        return;
    }
    both_halves(s, &[r], y, 0);
}

/// `y_r += B (scale A x_r)` for each row `r` of `rows` straight onto `y`
/// (the rows of `y` are the batch's), with the same bits as
/// [`low_rank_rows`] into zeroed scratch added to `y` after: on AVX-512
/// tiles (`lora_tiles.rs`, 512- or 256-bit), the rows shared between
/// threads. For many rows (a prompt's), where a pass over scratch and
/// another adding it cost as much as the low-rank products. Returns
/// `false`, having done nothing, where the CPU has neither AVX-512 nor
/// AVX2 with FMA and F16C, the rank is above the tiles' limit or the rows
/// are not ascending.
pub(crate) fn add_low_rank_rows(s: &LowRank, rows: &[usize], y: &mut [f32]) -> Result<bool> {
    check_fits(s, rows, y)?;
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = crate::lora_tiles::available() {
        return Ok(add_low_rank_rows_on(isa, s, rows, y));
    }
    Ok(false)
}

/// [`add_low_rank_rows`] on `isa`'s tiles, which the CPU runs, for rows
/// that fit (`check_fits`).
#[cfg(target_arch = "x86_64")]
fn add_low_rank_rows_on(
    isa: crate::lora_tiles::Isa,
    s: &LowRank,
    rows: &[usize],
    y: &mut [f32],
) -> bool {
    if s.rank > crate::lora_tiles::MAX_RANK || !rows.windows(2).all(|w| w[0] < w[1]) {
        return false;
    }
    split_rows_with(rows, s.n, y, 0, &|rows, y, first| {
        // SAFETY: the CPU runs `isa`'s tiles (the caller's `available`).
        unsafe { crate::lora_tiles::add_tiled(isa, s, rows, y, first) }
    });
    true
}

/// Refuses rows of `x` or `y`, or weights, shorter than the shapes say.
fn check_fits(s: &LowRank, rows: &[usize], y: &[f32]) -> Result<()> {
    let (k, n, rank) = (s.k, s.n, s.rank);
    let fits = s.a.len() >= rank * k
        && s.bt.len() >= n * rank
        && rows
            .iter()
            .all(|&r| (r + 1) * k <= s.x.len() && (r + 1) * n <= y.len());
    if !fits {
        candle_core::bail!("LoRA delta: the rows do not fit the adapter's shapes");
    }
    Ok(())
}

/// Rows from which a call's rows are shared between two threads (below,
/// a thread's start costs more than it saves).
const PARALLEL_ROWS: usize = 8;

/// Multiply-adds (`rows x rank x (k + n)`) from which two to seven rows are
/// split by rank halves between two threads. One row is not: the hand-off
/// costs about what the second thread would save.
const PARALLEL_RANK_WORK: usize = 8192;

/// [`low_rank_rows`] on `y` from batch row `first` on: halves of many
/// ascending rows in parallel, each row on one thread.
fn split_rows(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    split_rows_with(rows, s.n, y, first, &|rows, y, first| {
        both_halves(s, rows, y, first)
    });
}

/// `leaf(rows, y, first)` on parts of fewer than [`PARALLEL_ROWS`]
/// ascending rows, halves in parallel (`y` holds rows of `n` from batch
/// row `first` on).
fn split_rows_with(
    rows: &[usize],
    n: usize,
    y: &mut [f32],
    first: usize,
    leaf: &(impl Fn(&[usize], &mut [f32], usize) + Sync),
) {
    if rows.len() >= PARALLEL_ROWS {
        let mid = rows.len() / 2;
        let (low, high) = y.split_at_mut((rows[mid] - first) * n);
        rayon::join(
            || split_rows_with(&rows[..mid], n, low, first, leaf),
            || split_rows_with(&rows[mid..], n, high, rows[mid], leaf),
        );
        return;
    }
    leaf(rows, y, first);
}

/// The fixed order on this thread, `y` from batch row `first` on.
fn both_halves(s: &LowRank, rows: &[usize], y: &mut [f32], first: usize) {
    let mut tmp = vec![0f32; rows.len() * s.n];
    half(s, rows, 0..s.rank / 2, y, |_, r| r - first);
    half(s, rows, s.rank / 2..s.rank, &mut tmp, |i, _| i);
    add_rows(s.n, rows, y, first, &tmp);
}

/// The fixed order for a few rows: the first rank half onto `y` on one
/// thread, the second into a scratch buffer on the other, added after.
fn split_rank(s: &LowRank, rows: &[usize], y: &mut [f32]) {
    let mut tmp = vec![0f32; rows.len() * s.n];
    rayon::join(
        || half(s, rows, 0..s.rank / 2, y, |_, r| r),
        || half(s, rows, s.rank / 2..s.rank, &mut tmp, |i, _| i),
    );
    add_rows(s.n, rows, y, 0, &tmp);
}

/// `y_r += tmp_i` for the `i`-th row `r` of `rows` (`y` from row `first`).
fn add_rows(n: usize, rows: &[usize], y: &mut [f32], first: usize, tmp: &[f32]) {
    for (i, &r) in rows.iter().enumerate() {
        let yr = &mut y[(r - first) * n..(r - first + 1) * n];
        for (y, t) in yr.iter_mut().zip(&tmp[i * n..(i + 1) * n]) {
            *y += t;
        }
    }
}

/// For each row `r` (the `i`-th of `rows`), output row `at(i, r)` of `out`
/// gets `sum over j in ranks of h_j B^T_j`, `h_j = scale A_j x_r`, in
/// ascending `j`; fused multiply-adds where the CPU has them.
fn half(
    s: &LowRank,
    rows: &[usize],
    ranks: std::ops::Range<usize>,
    out: &mut [f32],
    at: impl Fn(usize, usize) -> usize,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::vecmath::has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(
            s: &LowRank,
            rows: &[usize],
            ranks: std::ops::Range<usize>,
            out: &mut [f32],
            at: impl Fn(usize, usize) -> usize,
        ) {
            half_body::<true>(s, rows, ranks, out, at)
        }
        if rows.len() >= TILED_MIN_ROWS
            && crate::lora_tiles::available() == Some(crate::lora_tiles::Isa::Avx512)
        {
            prefetch_ranks(s, &ranks);
            // SAFETY: the CPU has AVX-512F, FMA and F16C.
            unsafe { crate::lora_tiles::half_tiled(s, rows, ranks, out, at) };
            return;
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        unsafe {
            if rows.len() <= FUSED_MAX_ROWS {
                fused::half_fused(s, rows, ranks, out, at)
            } else {
                fast(s, rows, ranks, out, at)
            }
        };
        return;
    }
    half_body::<false>(s, rows, ranks, out, at);
}

/// Rows up to which [`half`] converts each half-precision weight in
/// registers as it uses it, instead of widening a rank's `A` and `B^T`
/// rows into scratch first: with one or a few rows each weight is used
/// that many times, and the widening pass (a write and a re-read of every
/// weight) cost more than the arithmetic.
const FUSED_MAX_ROWS: usize = 4;

/// Rows from which [`half`] takes them in tiles of four on 512-bit
/// registers where the CPU has AVX-512 (`lora_tiles.rs`): each weight
/// loaded and widened once per tile instead of once per row.
const TILED_MIN_ROWS: usize = 2;

/// Asks for every cache line of `v` at once: an adapter's weights are
/// small runs that the base's weights have evicted since the last token;
/// read one run after another, the hardware prefetcher would fetch them a
/// line or two at a time, each after a trip to memory (a quarter of one
/// stream's decode time with a rank-8 adapter on every projection).
#[inline(always)]
fn prefetch(v: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    for line in v.chunks(32) {
        // SAFETY: a prefetch of a valid address has no effect on memory.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
}

/// [`prefetch`] of the `A` and `B^T` rows of `ranks`.
#[inline(always)]
fn prefetch_ranks(s: &LowRank, ranks: &std::ops::Range<usize>) {
    prefetch(&s.a[ranks.start * s.k..ranks.end * s.k]);
    prefetch(&s.bt[ranks.start * s.n..ranks.end * s.n]);
}

/// [`half`]'s loops, fused multiply-adds when `FMA`.
#[inline(always)]
fn half_body<const FMA: bool>(
    s: &LowRank,
    rows: &[usize],
    ranks: std::ops::Range<usize>,
    out: &mut [f32],
    at: impl Fn(usize, usize) -> usize,
) {
    use crate::vecmath::{dot16, f16_to_f32, madd};
    let (k, n) = (s.k, s.n);
    prefetch_ranks(s, &ranks);
    let (mut aj, mut bj) = (vec![0f32; k], vec![0f32; n]);
    for j in ranks {
        f16_to_f32(&s.a[j * k..(j + 1) * k], &mut aj);
        f16_to_f32(&s.bt[j * n..(j + 1) * n], &mut bj);
        for (i, &r) in rows.iter().enumerate() {
            let hj = s.scale * dot16::<FMA>(&s.x[r * k..(r + 1) * k], &aj);
            let o = at(i, r);
            for (y, &b) in out[o * n..(o + 1) * n].iter_mut().zip(&bj) {
                *y = madd::<FMA>(b, hj, *y);
            }
        }
    }
}

/// [`half_body`]`::<true>` with the weights converted in registers
/// (`vcvtph2ps`): the same fused multiply-adds in the same order on the
/// same (exactly widened) values, so the same bits.
#[cfg(target_arch = "x86_64")]
mod fused {
    use std::arch::x86_64::*;

    use super::{prefetch_ranks, LowRank};

    /// Eight half-precision values at `p` as f32.
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// [`crate::vecmath::dot16`]`::<true>(x, widened a_t)` for the `M`
    /// rows `a_t` of `k` values from `a` on: each row's sixteen interleaved
    /// partial sums, then its tail in order (the chains of the `M` rows run
    /// side by side, and each loaded `x` serves all of them).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `a` holds `M * k` values and `x` at least `k`.
    #[inline(always)]
    unsafe fn dots_half<const M: usize>(x: &[f32], a: *const u16, k: usize) -> [f32; M] {
        let k16 = k / 16 * 16;
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
        for i in (0..k16).step_by(16) {
            // SAFETY: `i + 16 <= k` for `x` and every row.
            unsafe {
                let xp = x.as_ptr().add(i);
                let (x0, x1) = (_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)));
                for t in 0..M {
                    let ap = a.add(t * k + i);
                    lo[t] = _mm256_fmadd_ps(x0, load8(ap), lo[t]);
                    hi[t] = _mm256_fmadd_ps(x1, load8(ap.add(8)), hi[t]);
                }
            }
        }
        // Loops, not closures: a closure would not inherit the caller's
        // target features, and its intrinsics would be calls.
        let mut out = [0f32; M];
        for (t, out) in out.iter_mut().enumerate() {
            let mut acc = [0f32; 16];
            // SAFETY: `acc` holds sixteen values; the row is in bounds.
            let row = unsafe {
                _mm256_storeu_ps(acc.as_mut_ptr(), lo[t]);
                _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[t]);
                std::slice::from_raw_parts(a.add(t * k), k)
            };
            let mut tail = 0f32;
            for (&x, &w) in x[k16..k].iter().zip(&row[k16..k]) {
                tail = x.mul_add(half::f16::from_bits(w).to_f32(), tail);
            }
            *out = acc.iter().sum::<f32>() + tail;
        }
        out
    }

    /// `y += h_t b_t` for `t` in order (`b_t` the `M` rows of `n` half
    /// precision values from `b` on), fused, elementwise: each output
    /// element gets the same multiply-adds in the same order as `M` passes
    /// would give it, with one load and store of `y` per eight elements.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `b` holds `M * n` values and `y` at least `n`.
    #[inline(always)]
    unsafe fn axpy_half<const M: usize>(y: &mut [f32], b: *const u16, n: usize, h: [f32; M]) {
        let n8 = n / 8 * 8;
        let mut hv = [_mm256_setzero_ps(); M];
        for (v, &h) in hv.iter_mut().zip(&h) {
            *v = _mm256_set1_ps(h);
        }
        for i in (0..n8).step_by(8) {
            // SAFETY: `i + 8 <= n` for `y` and every row.
            unsafe {
                let yp = y.as_mut_ptr().add(i);
                let mut v = _mm256_loadu_ps(yp);
                for (t, hv) in hv.iter().enumerate() {
                    v = _mm256_fmadd_ps(load8(b.add(t * n + i)), *hv, v);
                }
                _mm256_storeu_ps(yp, v);
            }
        }
        for (e, y) in y[n8..n].iter_mut().enumerate() {
            for (t, &h) in h.iter().enumerate() {
                // SAFETY: `n8 + e < n`.
                let w = unsafe { *b.add(t * n + n8 + e) };
                *y = half::f16::from_bits(w).to_f32().mul_add(h, *y);
            }
        }
    }

    /// Ranks `j..j + M` for every row: their `h` then their updates.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; the ranks exist.
    #[inline(always)]
    unsafe fn ranks_fused<const M: usize>(
        s: &LowRank,
        rows: &[usize],
        j: usize,
        out: &mut [f32],
        at: &impl Fn(usize, usize) -> usize,
    ) {
        let (k, n) = (s.k, s.n);
        assert!((j + M) * k <= s.a.len() && (j + M) * n <= s.bt.len());
        for (i, &r) in rows.iter().enumerate() {
            // SAFETY: the rows of `A` and `B^T` checked above; `x` and
            // `out` rows by the slices.
            unsafe {
                let mut h = dots_half::<M>(&s.x[r * k..(r + 1) * k], s.a.as_ptr().add(j * k), k);
                for h in h.iter_mut() {
                    *h *= s.scale;
                }
                let o = at(i, r);
                axpy_half::<M>(&mut out[o * n..(o + 1) * n], s.bt.as_ptr().add(j * n), n, h);
            }
        }
    }

    /// Both rank halves of one row in one pass over it: every `h_j` first,
    /// then for each eight outputs the first half's multiply-adds onto
    /// `y`, the second half's from zero beside them, and their sum: the
    /// same operations in the same order as [`half_fused`] on each half
    /// (the second into zeroed scratch) and the scratch added after, so
    /// the same bits, without the scratch, its second pass over the row or
    /// a second burst of reads.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn one_row(s: &LowRank, r: usize, y: &mut [f32]) {
        let (k, n, rank) = (s.k, s.n, s.rank);
        assert!(rank * k <= s.a.len() && rank * n <= s.bt.len());
        let x = &s.x[r * k..(r + 1) * k];
        let y = &mut y[r * n..(r + 1) * n];
        prefetch_ranks(s, &(0..rank));
        let mut h = [0f32; 64];
        let mut h_long = Vec::new();
        let h: &mut [f32] = if rank <= h.len() {
            &mut h[..rank]
        } else {
            h_long.resize(rank, 0.0);
            &mut h_long
        };
        rank_steps!(0..rank, |j, M| {
            // SAFETY: rows `j..j + M` of `A` are in bounds (asserted).
            let d = unsafe { dots_half::<M>(x, s.a.as_ptr().add(j * k), k) };
            for (h, d) in h[j..j + M].iter_mut().zip(d) {
                *h = d * s.scale;
            }
        });
        let (first, second) = h.split_at(rank / 2);
        let b = s.bt.as_ptr();
        let n8 = n / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: `i + 8 <= n` for `y` and every row of `B^T`.
            unsafe {
                let yp = y.as_mut_ptr().add(i);
                let mut lo = _mm256_loadu_ps(yp);
                for (t, &h) in first.iter().enumerate() {
                    lo = _mm256_fmadd_ps(load8(b.add(t * n + i)), _mm256_set1_ps(h), lo);
                }
                let mut hi = _mm256_setzero_ps();
                for (t, &h) in second.iter().enumerate() {
                    let row = first.len() + t;
                    hi = _mm256_fmadd_ps(load8(b.add(row * n + i)), _mm256_set1_ps(h), hi);
                }
                _mm256_storeu_ps(yp, _mm256_add_ps(lo, hi));
            }
        }
        for (e, y) in y.iter_mut().enumerate().skip(n8) {
            let w = |t: usize| half::f16::from_bits(s.bt[t * n + e]).to_f32();
            let mut lo = *y;
            for (t, &h) in first.iter().enumerate() {
                lo = w(t).mul_add(h, lo);
            }
            let mut hi = 0f32;
            for (t, &h) in second.iter().enumerate() {
                hi = w(first.len() + t).mul_add(h, hi);
            }
            *y = lo + hi;
        }
    }

    /// [`super::half_body`] for a few rows, converting in registers, four
    /// ranks at a time (each output element still takes the ranks in
    /// ascending order, so the same bits).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn half_fused(
        s: &LowRank,
        rows: &[usize],
        ranks: std::ops::Range<usize>,
        out: &mut [f32],
        at: impl Fn(usize, usize) -> usize,
    ) {
        prefetch_ranks(s, &ranks);
        // SAFETY: the features are enabled; the ranks are the adapter's
        // (`ranks_fused` checks them against the weights).
        rank_steps!(ranks, |j, M| unsafe {
            ranks_fused::<M>(s, rows, j, out, &at)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vecmath::{f16_to_f32, f32_to_f16};

    fn to_half(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let mut h = vec![0u16; v.len()];
        f32_to_f16(v, &mut h);
        let mut back = vec![0f32; v.len()];
        f16_to_f32(&h, &mut back);
        (h, back)
    }

    /// The kernel against an f64 sum over the half-precision weights; its
    /// paths (one row alone, a few rows by rank halves on two threads, many
    /// rows shared by rows, without FMA) against each other.
    #[test]
    fn low_rank_rows_match_a_plain_sum() {
        for (k, n, rank) in [
            (576, 576, 8),
            (576, 192, 16),
            (1536, 576, 8),
            (37, 21, 3),
            (40, 19, 67),
        ] {
            let val = |i: usize| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.1;
            let x: Vec<f32> = (0..4 * k).map(|i| val(i + 1)).collect();
            let (a16, a) = to_half(&(0..rank * k).map(|i| val(i + 7)).collect::<Vec<_>>());
            let b: Vec<f32> = (0..n * rank).map(|i| val(i + 13)).collect();
            let bt: Vec<f32> = (0..rank * n).map(|i| b[(i % n) * rank + i / n]).collect();
            let (bt16, bt) = to_half(&bt);
            let rows = [0usize, 2, 3];
            let shape = LowRank {
                k,
                n,
                rank,
                scale: 2.0,
                x: &x,
                a: &a16,
                bt: &bt16,
            };
            let want = |r: usize, o: usize| -> f64 {
                (0..rank)
                    .map(|j| {
                        let h: f64 = (0..k)
                            .map(|i| x[r * k + i] as f64 * a[j * k + i] as f64)
                            .sum();
                        bt[j * n + o] as f64 * 2.0 * h
                    })
                    .sum()
            };
            let mut y = vec![1f32; 4 * n];
            low_rank_rows(&shape, &rows, &mut y).unwrap();
            // Without FMA, one thread, the fixed order written out.
            let mut plain = vec![1f32; 4 * n];
            let mut tmp = vec![0f32; 4 * n];
            half_body::<false>(&shape, &rows, 0..rank / 2, &mut plain, |_, r| r);
            half_body::<false>(&shape, &rows, rank / 2..rank, &mut tmp, |_, r| r);
            for (p, t) in plain.iter_mut().zip(&tmp) {
                *p += t;
            }
            // Rank halves on two threads, on one, and each row alone: the
            // same bits.
            let mut two = vec![1f32; 4 * n];
            split_rank(&shape, &rows, &mut two);
            let mut one = vec![1f32; 4 * n];
            both_halves(&shape, &rows, &mut one, 0);
            assert_eq!(two, one, "{k}x{n} r{rank}");
            assert_eq!(y, one, "{k}x{n} r{rank}");
            let mut alone = vec![1f32; 4 * n];
            for &r in &rows {
                low_rank_rows(&shape, &[r], &mut alone).unwrap();
            }
            assert_eq!(alone, one, "{k}x{n} r{rank}");
            for r in 0..4 {
                for o in 0..n {
                    let expect = if rows.contains(&r) {
                        1.0 + want(r, o)
                    } else {
                        1.0
                    };
                    for got in [y[r * n + o], plain[r * n + o]] {
                        assert!(
                            (got as f64 - expect).abs() < 1e-5,
                            "{k}x{n} r{rank}: {got} vs {expect}"
                        );
                    }
                }
            }
            // Many rows: shared between threads, each row as alone.
            let many: Vec<usize> = (0..4).chain(0..4).chain(0..4).collect::<Vec<_>>();
            let mut xs = Vec::new();
            for &r in &many {
                xs.extend_from_slice(&x[r * k..(r + 1) * k]);
            }
            let all: Vec<usize> = (0..many.len()).collect();
            let mut wide = vec![1f32; many.len() * n];
            let wide_shape = LowRank { x: &xs, ..shape };
            low_rank_rows(&wide_shape, &all, &mut wide).unwrap();
            for (i, &r) in many.iter().enumerate() {
                if rows.contains(&r) {
                    assert_eq!(&wide[i * n..(i + 1) * n], &y[r * n..(r + 1) * n]);
                }
            }
            // The in-register conversion against the widening pass, one
            // row and four: the same bits.
            #[cfg(target_arch = "x86_64")]
            if crate::vecmath::has_fma() {
                for rows in [&rows[..1], &rows[..], &[0, 1, 2, 3][..]] {
                    let mut widened = vec![1f32; 4 * n];
                    let mut fused = vec![1f32; 4 * n];
                    half_body::<true>(&shape, rows, 0..rank, &mut widened, |_, r| r);
                    // SAFETY: the CPU has AVX2, FMA and F16C.
                    unsafe { fused::half_fused(&shape, rows, 0..rank, &mut fused, |_, r| r) };
                    assert_eq!(fused, widened, "{k}x{n} r{rank}, {} rows", rows.len());
                    // Tiles of rows and ranks where the CPU has AVX-512.
                    if crate::lora_tiles::available() == Some(crate::lora_tiles::Isa::Avx512) {
                        let mut tiled = vec![1f32; 4 * n];
                        // SAFETY: the CPU has AVX-512F, FMA and F16C.
                        unsafe {
                            crate::lora_tiles::half_tiled(
                                &shape,
                                rows,
                                0..rank,
                                &mut tiled,
                                |_, r| r,
                            )
                        };
                        assert_eq!(tiled, widened, "{k}x{n} r{rank}, {} rows", rows.len());
                    }
                }
            }
            let mut short = vec![0f32; n];
            assert!(low_rank_rows(&shape, &[1], &mut short).is_err());
        }
    }

    /// The deltas added straight onto the base rows (a prompt's path)
    /// against the same deltas into zeroed scratch added after (a decode
    /// step's): the same bits, for ranks in tiles of four and not, rows
    /// in tiles of four and not, and column and input tails.
    #[test]
    fn direct_rows_match_scratch_rows() {
        let cases = [
            (576, 1536, 8),
            (1536, 576, 16),
            (37, 21, 3),
            (64, 48, 1),
            (48, 40, 7),
        ];
        for (k, n, rank) in cases {
            let val = |i: usize| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.1;
            let batch = 23;
            let x: Vec<f32> = (0..batch * k).map(|i| val(i + 3)).collect();
            let (a16, _) = to_half(&(0..rank * k).map(|i| val(i + 5)).collect::<Vec<_>>());
            let (bt16, _) = to_half(&(0..rank * n).map(|i| val(i + 11)).collect::<Vec<_>>());
            let shape = LowRank {
                k,
                n,
                rank,
                scale: 1.5,
                x: &x,
                a: &a16,
                bt: &bt16,
            };
            let base: Vec<f32> = (0..batch * n).map(|i| val(i + 17) * 10.0).collect();
            for rows in [
                (0..batch).collect::<Vec<_>>(),
                vec![1, 2, 3, 5, 8, 9, 10, 11, 12, 20, 22],
            ] {
                let mut scratch = vec![0f32; batch * n];
                low_rank_rows(&shape, &rows, &mut scratch).unwrap();
                let mut want = base.clone();
                for &r in &rows {
                    for (y, d) in want[r * n..(r + 1) * n].iter_mut().zip(&scratch[r * n..]) {
                        *y += d;
                    }
                }
                let mut got = base.clone();
                if add_low_rank_rows(&shape, &rows, &mut got).unwrap() {
                    assert_eq!(got, want, "{k}x{n} r{rank}, {} rows", rows.len());
                } else {
                    assert_eq!(got, base, "declined, yet changed");
                    eprintln!("no AVX2 here: the direct path is not taken");
                }
                // Each kind of tile the CPU runs (AVX-512 CPUs run both).
                #[cfg(target_arch = "x86_64")]
                for isa in crate::lora_tiles::runnable() {
                    let mut got = base.clone();
                    assert!(add_low_rank_rows_on(isa, &shape, &rows, &mut got));
                    assert_eq!(got, want, "{isa:?} {k}x{n} r{rank}, {} rows", rows.len());
                }
            }
        }
    }
}
