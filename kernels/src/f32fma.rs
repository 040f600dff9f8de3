//! Dense f32 layers on CPUs with AVX2 and FMA, with the weights packed once
//! at load.
//!
//! [`F32Matrix`] holds `W` (`[n, k]`) in panels of 16 output columns: for
//! each input `q`, the 16 columns' weights side by side (64 bytes, one
//! cache line, two registers). [`F32Matrix::matmul_acc`] adds `x W^T` onto
//! the destination in tiles of 6 rows x 16 columns: twelve accumulators,
//! and per input two weight loads, six broadcasts of the rows' activations
//! (read where they lie, no packing) and twelve FMAs, which keeps both FMA
//! pipes busy. A general GEMM (candle's, the `gemm` crate) packs the
//! weights again on every call and picks its blocking per call; encoder
//! layers have a few hundred rows against weights of a few hundred
//! kilobytes, where that work is a large share.
//!
//! Each output is one f32 sum in input order, fused multiply-adds from the
//! destination's value (the bias, or bias and residual) outward, so a
//! row's result depends on that row alone, not on the other rows of the
//! call.

use rayon::prelude::*;

use crate::{Error, SendPtr};

/// Output columns per panel (two registers of 8 lanes).
const NR: usize = 16;
/// Activation rows per tile.
const MR: usize = 6;
/// Tiles of rows per unit of parallel work (the panel stays in cache over
/// them).
const TILES_PER_TASK: usize = 8;
/// Inputs per pass over a task's tiles: a panel's 16 KiB slice stays in
/// L1 while the tiles pass it.
const KC: usize = 256;

/// One input's weights for a panel's 16 columns: one cache line.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct Line([f32; NR]);

/// A weight matrix `[n, k]` for `y += x W^T` in f32 (see the module docs).
#[derive(Debug, Clone)]
pub struct F32Matrix {
    n: usize,
    k: usize,
    /// Panel `j`, input `q` at `j * k + q`; columns past `n` are zero.
    panels: Vec<Line>,
}

impl F32Matrix {
    /// Whether this CPU runs [`F32Matrix::matmul_acc`] (AVX2 and FMA).
    pub fn is_supported() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Whether this kernel is the faster f32 path here: AVX2 and FMA
    /// without AVX-512F. On AVX-512 CPUs a general GEMM has 512-bit kernels
    /// with twice the lanes of these 256-bit tiles (not measured against
    /// them), so callers keep it there.
    pub fn is_preferred() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            Self::is_supported() && !std::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Packs `w` (`[n, k]`, row major).
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self, Error> {
        if w.len() != n * k || n == 0 || k == 0 {
            return Err(Error(format!(
                "{} values for a [{n}, {k}] f32 matrix",
                w.len()
            )));
        }
        let mut panels = vec![Line([0.0; NR]); n.div_ceil(NR) * k];
        panels.par_chunks_mut(k).enumerate().for_each(|(j, panel)| {
            for c in 0..NR.min(n - j * NR) {
                let row = &w[(j * NR + c) * k..][..k];
                for (line, &v) in panel.iter_mut().zip(row) {
                    line.0[c] = v;
                }
            }
        });
        Ok(Self { n, k, panels })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weights, `[n, k]` row major.
    pub fn weights(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n * self.k];
        for (r, row) in w.chunks_mut(self.k).enumerate() {
            let panel = &self.panels[(r / NR) * self.k..][..self.k];
            for (v, line) in row.iter_mut().zip(panel) {
                *v = line.0[r % NR];
            }
        }
        w
    }

    /// `dst[m, n] += x[m, k] . W^T`, across the rayon pool.
    ///
    /// # Panics
    /// If the CPU lacks AVX2 or FMA ([`F32Matrix::is_supported`]) or the
    /// lengths do not match.
    pub fn matmul_acc(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        assert!(Self::is_supported(), "this CPU has no AVX2 and FMA");
        assert_eq!(x.len(), m * self.k, "x is not [{m}, {}]", self.k);
        assert_eq!(dst.len(), m * self.n, "dst is not [{m}, {}]", self.n);
        if m == 0 {
            return;
        }
        crate::with_scratch(&PACKED, KEEP_PACKED_BYTES, |a| self.run(a, x, m, dst));
    }

    fn run(&self, a: &mut Vec<f32>, x: &[f32], m: usize, dst: &mut [f32]) {
        let k = self.k;
        let tile_len = MR * k.next_multiple_of(8);
        pack_tiles(x, k, tile_len, a);
        let a = &a[..];
        let row_tasks = m.div_ceil(MR * TILES_PER_TASK);
        let panels_n = self.n.div_ceil(NR);
        let out = SendPtr(dst.as_mut_ptr());
        // Consecutive tasks share their rows and take the next panel: a
        // thread's rows stay in cache while the panels stream past.
        (0..row_tasks * panels_n).into_par_iter().for_each(|t| {
            let (rt, j) = (t / panels_n, t % panels_n);
            let rows = rt * MR * TILES_PER_TASK..m.min((rt + 1) * MR * TILES_PER_TASK);
            let cols = j * NR..self.n.min((j + 1) * NR);
            let panel = &self.panels[j * k..][..k];
            // SAFETY: the CPU has AVX2 and FMA (asserted by `matmul_acc`);
            // `a` holds the packed tiles of `m` rows of `k`, the panel `k`
            // lines; each task writes only its own rows x columns of `dst`
            // (`[m, n]`), so no two tasks touch the same element.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2::block(a, k, tile_len, panel, out, self.n, rows, cols)
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (a, panel, out, rows, cols);
        });
    }
}

/// Largest packed activation buffer kept for the next call (see
/// `bf16.rs`'s).
const KEEP_PACKED_BYTES: usize = 16 << 20;

thread_local! {
    /// The packed activations of the last call on this thread, kept for
    /// the next up to [`KEEP_PACKED_BYTES`].
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The activations regrouped by tiles of [`MR`] rows into `a`: tile `t`
/// at `t * tile_len`, inputs `8 b..8 b + 8` of its row `i` at `(6 b + i)
/// * 8`, so a tile's broadcasts read one stream; inputs past `k` are 0.
fn pack_tiles(x: &[f32], k: usize, tile_len: usize, a: &mut Vec<f32>) {
    let tiles = (x.len() / k).div_ceil(MR);
    // Every element is written below; zeroing is only for new capacity.
    a.resize(tiles * tile_len, 0.0);
    a.par_chunks_mut(tile_len)
        .zip(x.par_chunks(MR * k))
        .for_each(|(tile, rows)| {
            for (i, row) in rows.chunks(k).enumerate() {
                // Whole arrays of 8: moves of one register, not `memcpy`
                // calls of a run-time length.
                let mut eights = row.chunks_exact(8);
                for (b, eight) in eights.by_ref().enumerate() {
                    let at = (MR * b + i) * 8;
                    let to: &mut [f32; 8] = (&mut tile[at..at + 8]).try_into().unwrap();
                    *to = eight.try_into().unwrap();
                }
                let rest = eights.remainder();
                if !rest.is_empty() {
                    let at = (MR * (k / 8) + i) * 8;
                    let mut last = [0f32; 8];
                    last[..rest.len()].copy_from_slice(rest);
                    tile[at..at + 8].copy_from_slice(&last);
                }
            }
        });
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Line, KC, MR, NR};
    use crate::SendPtr;

    /// `dst[rows, cols] += x[rows] . panel` in tiles of [`MR`] rows (`a`:
    /// the packed tiles, `tile_len` apart), [`KC`] inputs at a time over
    /// all the tiles, so that slice of the panel stays in L1.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block(
        a: &[f32],
        k: usize,
        tile_len: usize,
        panel: &[Line],
        dst: SendPtr,
        ldd: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        assert!(rows.start.is_multiple_of(MR) && rows.end.div_ceil(MR) * tile_len <= a.len());
        assert!(panel.len() == k && tile_len >= MR * k);
        assert!(cols.len() <= NR && cols.start + cols.len() <= ldd);
        let masks: [__m256i; 2] = std::array::from_fn(|t| {
            let lanes = cols.len().saturating_sub(8 * t).min(8) as i32;
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        });
        let p = panel.as_ptr().cast::<f32>();
        let full = cols.len() == NR;
        let mut q0 = 0;
        while q0 < k {
            let q = q0..k.min(q0 + KC);
            let mut r = rows.start;
            while r < rows.end {
                let t = a.as_ptr().add(r / MR * tile_len);
                let d = dst.0.add(r * ldd + cols.start);
                // The next tile's outputs, asked for while this one runs
                // (on the first pass they come from L3 or memory); the
                // line of a row's last column may lie past a partial
                // panel's end, hence `wrapping_add` (a prefetch of any
                // address is harmless).
                if r + MR < rows.end {
                    for i in 0..MR.min(rows.end - r - MR) {
                        let at = d.add((MR + i) * ldd);
                        _mm_prefetch::<_MM_HINT_T0>(at.cast());
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(NR - 1).cast());
                    }
                }
                let q = q.clone();
                match (rows.end - r, full) {
                    (1, _) => tile::<1, false>(t, q, p, d, ldd, masks),
                    (2, _) => tile::<2, false>(t, q, p, d, ldd, masks),
                    (3, _) => tile::<3, false>(t, q, p, d, ldd, masks),
                    (4, _) => tile::<4, false>(t, q, p, d, ldd, masks),
                    (5, _) => tile::<5, false>(t, q, p, d, ldd, masks),
                    (_, true) => tile::<MR, true>(t, q, p, d, ldd, masks),
                    (_, false) => tile::<MR, false>(t, q, p, d, ldd, masks),
                }
                r += MR;
            }
            q0 += KC;
        }
    }

    /// Input `q` of a tile (see [`tile`]): two weight registers, `R`
    /// broadcasts, `2 R` FMAs. Not a closure: closures do not take the
    /// caller's target features, and the intrinsics would become calls.
    #[inline(always)]
    unsafe fn step<const R: usize>(
        acc: &mut [[__m256; 2]; R],
        t: *const f32,
        p: *const f32,
        q: usize,
    ) {
        let b = p.add(q * NR);
        let w = [_mm256_load_ps(b), _mm256_load_ps(b.add(8))];
        let x = t.add((q / 8) * MR * 8 + q % 8);
        for (i, acc) in acc.iter_mut().enumerate() {
            let xv = _mm256_broadcast_ss(&*x.add(8 * i));
            acc[0] = _mm256_fmadd_ps(xv, w[0], acc[0]);
            acc[1] = _mm256_fmadd_ps(xv, w[1], acc[1]);
        }
    }

    /// `R` rows x 16 columns over inputs `q` (starting at a multiple of
    /// 8): `t` at the packed tile, `p` at the panel's start (64-byte
    /// aligned lines), `d` at the tile's first output. Each sum continues
    /// from the destination's value, so splitting the inputs changes no
    /// bits.
    #[inline(always)]
    unsafe fn tile<const R: usize, const FULL: bool>(
        t: *const f32,
        q: std::ops::Range<usize>,
        p: *const f32,
        d: *mut f32,
        ldd: usize,
        masks: [__m256i; 2],
    ) {
        // Masked moves only for a last, partial panel (they are slow on
        // some CPUs, and every full tile would pay for them).
        let mut acc: [[__m256; 2]; R] = std::array::from_fn(|i| {
            std::array::from_fn(|h| {
                let at = d.add(i * ldd + 8 * h);
                if FULL {
                    _mm256_loadu_ps(at)
                } else {
                    _mm256_maskload_ps(at, masks[h])
                }
            })
        });
        let full = q.start + (q.end - q.start) / 8 * 8;
        for q8 in (q.start..full).step_by(8) {
            for u in 0..8 {
                step(&mut acc, t, p, q8 + u);
            }
        }
        for q in full..q.end {
            step(&mut acc, t, p, q);
        }
        for (i, acc) in acc.iter().enumerate() {
            for h in 0..2 {
                let at = d.add(i * ldd + 8 * h);
                if FULL {
                    _mm256_storeu_ps(at, acc[h]);
                } else {
                    _mm256_maskstore_ps(at, masks[h], acc[h]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense_test_util::{assert_near_f64, seeded};

    #[test]
    fn packing_keeps_the_weights() {
        for (n, k) in [(1, 1), (3, 5), (16, 32), (70, 33), (130, 384)] {
            let w = seeded(n * k, 7);
            let m = F32Matrix::new(&w, n, k).unwrap();
            assert_eq!((m.n(), m.k()), (n, k));
            assert_eq!(m.weights(), w);
        }
        assert!(F32Matrix::new(&[1.0; 6], 2, 4).is_err());
        assert!(F32Matrix::new(&[], 0, 4).is_err());
    }

    /// Against f64 sums, for tails in rows (`m` not a multiple of 6 or of
    /// a task's 48), columns (`n` not a multiple of 16), inputs (`k` not a
    /// multiple of 8, or past a pass of 256) and the encoders' shapes (384
    /// -> 1152, 384 -> 1536, 1536 -> 384).
    #[test]
    fn matches_f64() {
        if !F32Matrix::is_supported() {
            eprintln!("no AVX2 and FMA on this CPU: f32 kernel not run");
            return;
        }
        for (m, n, k) in [
            (1, 16, 32),
            (3, 70, 33),
            (7, 1, 17),
            (50, 1152, 384),
            (13, 1536, 384),
            (97, 384, 1536),
            (13, 40, 300),
        ] {
            let (x, w) = (seeded(m * k, 1), seeded(n * k, 2));
            let base = seeded(m * n, 3);
            let mat = F32Matrix::new(&w, n, k).unwrap();
            let mut dst = base.clone();
            mat.matmul_acc(&x, m, &mut dst);
            assert_near_f64(&x, &w, &base, &dst, (m, n, k), f64::from);
        }
    }

    /// A row's result does not depend on the other rows of the call, and
    /// columns past a partial panel's end are left alone.
    #[test]
    fn rows_are_independent_of_the_batch() {
        if !F32Matrix::is_supported() {
            return;
        }
        let (n, k) = (100, 96);
        let w = F32Matrix::new(&seeded(n * k, 4), n, k).unwrap();
        let x = seeded(50 * k, 5);
        let mut all = vec![0f32; 50 * n];
        w.matmul_acc(&x, 50, &mut all);
        for r in [0, 5, 6, 47, 48, 49] {
            let mut one = vec![0f32; n + 3];
            w.matmul_acc(&x[r * k..][..k], 1, &mut one[..n]);
            assert_eq!(one[..n], all[r * n..][..n]);
            assert_eq!(one[n..], [0.0; 3]);
        }
    }
}
