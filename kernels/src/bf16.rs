//! Dense f32 layers computed with bf16 inputs and f32 accumulation, on CPUs
//! with AVX-512 BF16 (`vdpbf16ps`: AMD Zen 4 and later, Intel Cooper Lake
//! and Sapphire Rapids and later).
//!
//! [`Bf16Matrix`] holds `W` (`[n, k]`, f32 at load) rounded to bf16 and
//! packed in panels of 64 output columns: for each pair of inputs
//! `(2p, 2p + 1)`, the 64 columns' two weights side by side, 256 bytes,
//! four registers. [`Bf16Matrix::matmul_acc`] rounds the activations to
//! bf16 (round to nearest even; a row of bf16 is already laid out in
//! pairs) and adds `x W^T` onto the destination: tiles of 6 rows x 64
//! columns are 24 accumulators, and each `vdpbf16ps` adds two products
//! per lane to one of them, twice the multiply-adds per instruction of an
//! f32 FMA. Products of two bf16 values are exact in f32, so the only
//! rounding besides the inputs' is that of the f32 sums, in a fixed order
//! over `k`: every row's result depends on that row alone, not on which
//! other rows share the call.
//!
//! On CPUs with AMX-BF16 (Intel Sapphire Rapids and later), matrices whose
//! input is a multiple of 32 run on the tiles instead ([`amx`]: the panels
//! are its `B` tiles as they lie); the sums are then in the tile unit's
//! order, still per row alone.
//!
//! The inputs lose 16 of f32's 24 mantissa bits (relative error at most
//! 2^-9 each, 2^-10 on average); sums over hundreds of terms average much
//! of that out. What that does to a whole model is for its caller to
//! measure (the embedding model's figures are in the project's README).

use rayon::prelude::*;

use crate::{Error, SendPtr};

#[cfg(target_arch = "x86_64")]
mod amx;

/// Output columns per panel (four registers of 16 lanes).
const NR: usize = 64;
/// Activation rows per tile.
const MR: usize = 6;
/// Tiles of rows per unit of parallel work.
const TILES_PER_TASK: usize = 8;

/// Rounds to bf16, to nearest even (as `vcvtneps2bf16`, except that
/// subnormals are kept); NaN stays NaN.
fn to_bf16(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// One or two values rounded to bf16 as a pair: the first in the low half,
/// the second (0 when absent, for an odd count) in the high half.
fn pack_pair(pair: &[f32]) -> u32 {
    let lo = to_bf16(pair[0]) as u32;
    let hi = pair.get(1).map_or(0, |&v| to_bf16(v) as u32);
    lo | (hi << 16)
}

/// A weight matrix `[n, k]` for `y += x W^T` in bf16 (see the module docs).
#[derive(Debug, Clone)]
pub struct Bf16Matrix {
    n: usize,
    k: usize,
    /// Input pairs, `k / 2` rounded up (an odd `k`'s last pair ends in 0).
    kp: usize,
    /// Panel `j`, pair `p`, column `c` at `(j * kp + p) * NR + c`: the
    /// column's weights `2p` (low half) and `2p + 1` (high half); columns
    /// past `n` are zero.
    panels: Vec<u32>,
}

impl Bf16Matrix {
    /// Whether this CPU runs [`Bf16Matrix::matmul_acc`].
    pub fn is_supported() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Whether this kernel is meant for this CPU's encoders: where its
    /// products run on AMX-BF16 tiles, or on CPUs other than Intel's (AMD
    /// Zen 4 and later). Intel cores without AMX run `vdpbf16ps` at half
    /// the rate of their FMAs, so the bf16 arithmetic there was no faster
    /// than f32, and [`crate::I16Matrix`] 1.7x faster (benches/README.md).
    pub fn is_preferred() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            Self::is_supported() && (amx::available() || !crate::is_intel())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Rounds and packs `w` (`[n, k]`, row major).
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self, Error> {
        if w.len() != n * k || n == 0 || k == 0 {
            return Err(Error(format!(
                "{} values for a [{n}, {k}] bf16 matrix",
                w.len()
            )));
        }
        let kp = k.div_ceil(2);
        let panels_n = n.div_ceil(NR);
        let mut panels = vec![0u32; panels_n * kp * NR];
        panels
            .par_chunks_mut(kp * NR)
            .enumerate()
            .for_each(|(j, panel)| {
                for c in 0..NR.min(n - j * NR) {
                    let row = &w[(j * NR + c) * k..][..k];
                    for (p, pair) in row.chunks(2).enumerate() {
                        panel[p * NR + c] = pack_pair(pair);
                    }
                }
            });
        Ok(Self { n, k, kp, panels })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weights as the kernel sees them (rounded to bf16), `[n, k]`.
    pub fn weights_f32(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n * self.k];
        for (r, row) in w.chunks_mut(self.k).enumerate() {
            let panel = &self.panels[(r / NR) * self.kp * NR..];
            for (i, v) in row.iter_mut().enumerate() {
                let pair = panel[(i / 2) * NR + r % NR];
                *v = f32::from_bits(if i % 2 == 0 {
                    pair << 16
                } else {
                    pair & 0xFFFF_0000
                });
            }
        }
        w
    }

    /// `dst[m, n] += x[m, k] . W^T`, across the rayon pool.
    ///
    /// # Panics
    /// If the CPU lacks AVX-512 BF16 ([`Bf16Matrix::is_supported`]) or the
    /// lengths do not match.
    pub fn matmul_acc(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        assert!(Self::is_supported(), "this CPU has no AVX-512 BF16");
        assert_eq!(x.len(), m * self.k, "x is not [{m}, {}]", self.k);
        assert_eq!(dst.len(), m * self.n, "dst is not [{m}, {}]", self.n);
        if m == 0 {
            return;
        }
        crate::with_scratch(&PACKED, KEEP_PACKED_BYTES, |a| self.run(a, x, m, dst));
    }

    /// Whether this matrix's products run on AMX-BF16 tiles (where the
    /// CPU has them and the input pairs are whole steps of the tiles).
    fn on_tiles(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.kp.is_multiple_of(amx::PAIRS) && amx::available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    fn run(&self, a: &mut Vec<u32>, x: &[f32], m: usize, dst: &mut [f32]) {
        self.run_with(self.on_tiles(), a, x, m, dst)
    }

    /// [`Bf16Matrix::run`] on AMX tiles (`tiles`, checked by the caller)
    /// or the 512-bit kernel.
    fn run_with(&self, tiles: bool, a: &mut Vec<u32>, x: &[f32], m: usize, dst: &mut [f32]) {
        pack_rows(x, self.k, self.kp, a);
        let a = &a[..];
        let row_tasks = m.div_ceil(MR * TILES_PER_TASK);
        let panels_n = self.n.div_ceil(NR);
        let out = SendPtr(dst.as_mut_ptr());
        let each = |t: usize| {
            let (rt, j) = (t / panels_n, t % panels_n);
            let rows = rt * MR * TILES_PER_TASK..(m.min((rt + 1) * MR * TILES_PER_TASK));
            let cols = j * NR..self.n.min((j + 1) * NR);
            let panel = &self.panels[j * self.kp * NR..][..self.kp * NR];
            // SAFETY: the CPU has AVX-512 BF16 (asserted above); `a` holds
            // `m` rows of `kp` pairs, the panel `kp * NR` pairs; each task
            // writes only its own rows x columns of `dst` (`[m, n]`), so no
            // two tasks touch the same element.
            // With `tiles`, AMX-BF16 is available and `kp` a whole number
            // of its steps.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                if tiles {
                    amx::block(a, self.kp, panel, out, self.n, rows, cols)
                } else {
                    avx512::block(a, self.kp, panel, out, self.n, rows, cols)
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (tiles, a, panel, out, rows, cols);
        };
        // Each thread a contiguous run of tasks (its rows stay in cache
        // while the panels stream past), the last ones shared one at a
        // time (`claim.rs`).
        crate::claim::for_each_claimed(row_tasks * panels_n, rayon::current_num_threads(), &each);
    }
}

/// Largest activation buffer kept for the next call: batches of a few
/// thousand values per row reuse theirs, while the buffer of one huge batch
/// (25 MiB at 8192 tokens into a 1536-wide layer) goes back to the system
/// instead of staying resident for the life of the thread.
const KEEP_PACKED_BYTES: usize = 4 << 20;

thread_local! {
    /// The rounded activations of the last call on this thread, kept for
    /// the next (a fresh multi-megabyte buffer costs page faults each time)
    /// up to [`KEEP_PACKED_BYTES`].
    static PACKED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The activations rounded to bf16 into `a`, row `r` at `r * kp` (pairs).
fn pack_rows(x: &[f32], k: usize, kp: usize, a: &mut Vec<u32>) {
    let m = x.len() / k;
    // Every element is written below; zeroing is only for new capacity.
    a.resize(m * kp, 0);
    a.par_chunks_mut(kp * 16)
        .zip(x.par_chunks(k * 16))
        .for_each(|(a, x)| {
            for (dst, row) in a.chunks_mut(kp).zip(x.chunks(k)) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only called once `matmul_acc` checked the CPU.
                unsafe {
                    avx512::round_row(row, dst)
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (row, dst);
            }
        });
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{pack_pair, SendPtr, MR, NR};

    /// One row rounded to bf16 pairs (`dst.len() == row.len().div_ceil(2)`).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_row(row: &[f32], dst: &mut [u32]) {
        let full = row.len() / 16;
        for i in 0..full {
            let v = _mm512_loadu_ps(row.as_ptr().add(16 * i));
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_storeu_si256(dst.as_mut_ptr().add(8 * i).cast(), b);
        }
        for (p, pair) in row[16 * full..].chunks(2).enumerate() {
            dst[8 * full + p] = pack_pair(pair);
        }
    }

    /// The masks of a panel's four registers of output columns when
    /// `width` (at most 64) of them exist.
    pub(super) fn column_masks(width: usize) -> [__mmask16; 4] {
        std::array::from_fn(|t| {
            let lanes = width.saturating_sub(16 * t).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        })
    }

    /// `dst[rows, cols] += a[rows] . panel` in tiles of [`MR`] rows.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn block(
        a: &[u32],
        kp: usize,
        panel: &[u32],
        dst: SendPtr,
        ldd: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        assert!(rows.end * kp <= a.len() && panel.len() == kp * NR);
        assert!(cols.len() <= NR && cols.start + cols.len() <= ldd);
        let masks = column_masks(cols.len());
        let mut r = rows.start;
        while r < rows.end {
            let a = a.as_ptr().add(r * kp);
            let d = dst.0.add(r * ldd + cols.start);
            let p = panel.as_ptr();
            match rows.end - r {
                1 => tile::<1>(a, kp, p, d, ldd, masks),
                2 => tile::<2>(a, kp, p, d, ldd, masks),
                3 => tile::<3>(a, kp, p, d, ldd, masks),
                4 => tile::<4>(a, kp, p, d, ldd, masks),
                5 => tile::<5>(a, kp, p, d, ldd, masks),
                _ => tile::<MR>(a, kp, p, d, ldd, masks),
            }
            r += MR;
        }
    }

    /// `R` rows x 64 columns: `a` at the tile's first row (rows `kp`
    /// apart), `p` at the panel's start, `d` at the tile's first output.
    #[inline(always)]
    unsafe fn tile<const R: usize>(
        a: *const u32,
        kp: usize,
        p: *const u32,
        d: *mut f32,
        ldd: usize,
        masks: [__mmask16; 4],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for q in 0..kp {
            let b = p.add(q * NR);
            let w: [__m512bh; 4] = std::array::from_fn(|t| {
                std::mem::transmute(_mm512_loadu_si512(b.add(16 * t).cast()))
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i * kp + q) as i32));
                for t in 0..4 {
                    acc[t] = _mm512_dpbf16_ps(acc[t], x, w[t]);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for t in 0..4 {
                let at = d.add(i * ldd + 16 * t);
                let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(masks[t], at), acc[t]);
                _mm512_mask_storeu_ps(at, masks[t], sum);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense_test_util::{assert_near_f64, seeded};

    fn bf16_f64(v: f32) -> f64 {
        half::bf16::from_f32(v).to_f64()
    }

    #[test]
    fn packing_keeps_the_rounded_weights() {
        for (n, k) in [(1, 1), (3, 5), (64, 32), (70, 33), (130, 384)] {
            let w = seeded(n * k, 7);
            let m = Bf16Matrix::new(&w, n, k).unwrap();
            let got = m.weights_f32();
            for (g, v) in got.iter().zip(&w) {
                assert_eq!(*g, half::bf16::from_f32(*v).to_f32());
            }
        }
        assert!(Bf16Matrix::new(&[1.0; 6], 2, 4).is_err());
    }

    /// Against f64 sums of the same rounded inputs, for tails in rows
    /// (`m` not a multiple of 6), columns (`n` not a multiple of 64) and
    /// inputs (odd `k`, `k` not a multiple of 16).
    #[test]
    fn matches_f64_on_rounded_inputs() {
        if !Bf16Matrix::is_supported() {
            eprintln!("no AVX-512 BF16 on this CPU: bf16 kernel not run");
            return;
        }
        for (m, n, k) in [
            (1, 64, 32),
            (3, 70, 33),
            (16, 384, 384),
            (64, 130, 1536),
            (7, 1, 17),
        ] {
            let (x, w) = (seeded(m * k, 1), seeded(n * k, 2));
            let base = seeded(m * n, 3);
            let mat = Bf16Matrix::new(&w, n, k).unwrap();
            let mut dst = base.clone();
            mat.matmul_acc(&x, m, &mut dst);
            assert_near_f64(&x, &w, &base, &dst, (m, n, k), bf16_f64);
        }
    }

    /// The AMX-BF16 tiles, where this CPU has them, against f64 sums, for
    /// short last tiles of rows and columns and one or many steps over the
    /// input.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tiles_match_f64() {
        // Not `available`: its start-up check would hide a wrong kernel.
        if !amx::granted() {
            eprintln!("no AMX-BF16 tiles on this CPU (or not granted): tiles not run");
            return;
        }
        for (m, n, k) in [(1, 64, 32), (17, 130, 96), (37, 384, 384), (50, 70, 1536)] {
            let (x, w) = (seeded(m * k, 6), seeded(n * k, 7));
            let base = seeded(m * n, 8);
            let mat = Bf16Matrix::new(&w, n, k).unwrap();
            let mut dst = base.clone();
            mat.run_with(true, &mut Vec::new(), &x, m, &mut dst);
            assert_near_f64(&x, &w, &base, &dst, (m, n, k), bf16_f64);
        }
    }

    /// A row's result does not depend on the other rows of the call.
    #[test]
    fn rows_are_independent_of_the_batch() {
        if !Bf16Matrix::is_supported() {
            return;
        }
        let (n, k) = (100, 96);
        let w = Bf16Matrix::new(&seeded(n * k, 4), n, k).unwrap();
        let x = seeded(50 * k, 5);
        let mut all = vec![0f32; 50 * n];
        w.matmul_acc(&x, 50, &mut all);
        for r in [0, 5, 6, 49] {
            let mut one = vec![0f32; n];
            w.matmul_acc(&x[r * k..][..k], 1, &mut one);
            assert_eq!(one, all[r * n..][..n]);
        }
    }
}
