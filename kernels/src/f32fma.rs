//! Dense f32 layers on CPUs with AVX2 and FMA, with the weights packed once
//! at load.
//!
//! [`F32Matrix`] holds `W` (`[n, k]`) in panels of 16 output columns: for
//! each input `q`, the 16 columns' weights side by side (64 bytes, one
//! cache line, two registers). [`F32Matrix::matmul`] computes `x W^T` in
//! tiles of 6 rows x 16 columns: twelve accumulators, and per input two
//! weight loads, six broadcasts of the rows' activations and twelve FMAs,
//! which keeps both FMA pipes busy. The activations are read regrouped by
//! tiles ([`TiledRows`]; a tile's broadcasts read one stream): regrouped
//! by the call, or kept in that form by the caller from the layer that
//! wrote them. The sums start from the destination, or from a bias (and a
//! residual), and may leave through the exact GELU, so a layer's bias,
//! residual and activation need no passes of their own. A general GEMM (candle's, the `gemm` crate) packs the
//! weights again on every call and picks its blocking per call; encoder
//! layers have a few hundred rows against weights of a few hundred
//! kilobytes, where that work is a large share.
//!
//! Each output is one f32 sum in input order, fused multiply-adds from the
//! destination's value (the bias, or bias and residual) outward, so a
//! row's result depends on that row alone, not on the other rows of the
//! call.

use std::ops::Range;

use rayon::prelude::*;

use crate::{Error, SendPtr};

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod tiled;

pub use tiled::{TileMut, TiledIndex, TiledRows};

/// Output columns per panel (two registers of 8 lanes).
pub(crate) const NR: usize = 16;
/// Activation rows per tile.
pub(crate) const MR: usize = 6;
/// Tiles of rows per unit of parallel work (the panel stays in cache over
/// them).
const TILES_PER_TASK: usize = 8;
/// Inputs per pass over a task's tiles: a panel's 16 KiB slice stays in
/// L1 while the tiles pass it.
pub(crate) const KC: usize = 256;

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
        self.matmul(
            Input::Rows(x),
            m,
            Start::Dst,
            Activation::None,
            Output::Rows(dst),
        );
    }

    /// `out[m, n] = act(start + x[m, k] . W^T)`, across the rayon pool.
    /// A tiled output is shaped `[m, n]` by the call (with [`Start::Dst`]
    /// it must already be).
    ///
    /// # Panics
    /// If the CPU lacks AVX2 or FMA ([`F32Matrix::is_supported`]) or the
    /// shapes do not match.
    pub fn matmul(&self, x: Input, m: usize, start: Start, act: Activation, out: Output) {
        assert!(Self::is_supported(), "this CPU has no AVX2 and FMA");
        let (n, k) = (self.n, self.k);
        let out = Dest::prepare(&x, (m, n, k), &start, out);
        if m == 0 {
            return;
        }
        match x {
            Input::Tiled(t) => self.run(&t.data, out, start, act, m),
            Input::Rows(x) => crate::with_scratch(&PACKED, KEEP_PACKED_BYTES, |buf| {
                let mut t = TiledRows::from_buffer(std::mem::take(buf));
                t.pack(x, k);
                self.run(&t.data, out, start, act, m);
                *buf = t.data;
            }),
        }
    }

    fn run(&self, a: &[f32], out: Dest, start: Start, act: Activation, m: usize) {
        let k = self.k;
        let tile_len = tiled::tile_len(k);
        for_each_task(m, self.n, start, |rows, cols, init| {
            let panel = &self.panels[cols.start / NR * k..][..k];
            #[cfg(target_arch = "x86_64")]
            {
                let tiles = avx2::F32Tiles {
                    a: a.as_ptr(),
                    tile_len,
                    panel: panel.as_ptr().cast(),
                };
                assert!(rows.end.div_ceil(MR) * tile_len <= a.len() && tile_len >= MR * k);
                // SAFETY: the CPU has AVX2 and FMA (asserted by `matmul`);
                // `a` holds the packed tiles of `m` rows of `k` (checked
                // above), the panel `k` lines; `out`, the bias and the
                // residual cover `[m, n]` in their layouts (checked by
                // `matmul`); each task writes only its own rows x columns,
                // so no two tasks touch the same element.
                unsafe { avx2::block(tiles, k, out, init, act == Activation::GeluErf, rows, cols) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (a, panel, out, rows, cols, init, tile_len, act);
        });
    }
}

/// Runs `task(rows, cols, init)` across the rayon pool for every block of
/// up to [`TILES_PER_TASK`] tiles of rows (of `m`) x one panel of columns
/// (of `n`), with `init` at the block's place in `start`'s bias and
/// residual. Consecutive tasks share their rows and take the next panel: a
/// thread's rows stay in cache while the panels stream past.
pub(crate) fn for_each_task(
    m: usize,
    n: usize,
    start: Start,
    task: impl Fn(Range<usize>, Range<usize>, Init) + Sync + Send,
) {
    let row_tasks = m.div_ceil(MR * TILES_PER_TASK);
    let panels_n = n.div_ceil(NR);
    let (bias, residual) = match start {
        Start::Dst => (None, None),
        Start::Bias(b) => (Some(b), None),
        Start::BiasResidual(b, r) => (Some(b), Some(r)),
    };
    let each = |t: usize| {
        let (rt, j) = (t / panels_n, t % panels_n);
        let rows = rt * MR * TILES_PER_TASK..m.min((rt + 1) * MR * TILES_PER_TASK);
        let cols = j * NR..n.min((j + 1) * NR);
        let init = Init {
            bias: bias.map_or(std::ptr::null(), |b| b[cols.start..].as_ptr()),
            residual: residual.map_or(std::ptr::null(), |r| {
                r[rows.start * n + cols.start..].as_ptr()
            }),
            ldr: n,
        };
        task(rows, cols, init)
    };
    // Each thread a contiguous run of tasks (its rows stay in cache
    // while the panels stream past), the last ones shared one at a
    // time (`claim.rs`).
    crate::claim::for_each_claimed(row_tasks * panels_n, rayon::current_num_threads(), &each);
}

/// Where a task's sums start: the destination's values (`bias` null), or
/// the bias (at the panel's first column) plus, unless null, a row-major
/// residual with rows `ldr` apart (at the task's first row and column).
#[derive(Clone, Copy)]
pub(crate) struct Init {
    pub(crate) bias: *const f32,
    pub(crate) residual: *const f32,
    pub(crate) ldr: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Init {
    /// The start of the rows `i` below this one's, or `None` when the sums
    /// start from the destination.
    pub(crate) fn rows_down(self, i: usize) -> Option<Init> {
        if self.bias.is_null() {
            return None;
        }
        let residual = if self.residual.is_null() {
            self.residual
        } else {
            self.residual.wrapping_add(i * self.ldr)
        };
        Some(Init { residual, ..self })
    }
}

/// Where a task's outputs go: element `(r, c)` at `base(r, c)` from `ptr`,
/// with the rows of a tile `row_stride` apart and a panel's two halves of
/// 8 columns `half_stride` apart.
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    /// Passed whole into the tasks (a closure reading `ptr.0` would
    /// capture the bare pointer, which is not `Sync`).
    ptr: SendPtr,
    /// Row major with rows `ld` apart, or tiled ([`TiledRows`]) with
    /// tiles `ld` apart.
    tiled: bool,
    ld: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Dest {
    /// Checks the shapes of a matmul of `x` (`[m, k]`) into `out` (`[m,
    /// n]`) from `start` (a tiled output is shaped by the call unless the
    /// sums start from it) and describes the output.
    ///
    /// # Panics
    /// If a shape does not match.
    pub(crate) fn prepare(
        x: &Input,
        (m, n, k): (usize, usize, usize),
        start: &Start,
        out: Output,
    ) -> Self {
        match x {
            Input::Rows(x) => assert_eq!(x.len(), m * k, "x is not [{m}, {k}]"),
            Input::Tiled(t) => assert_eq!((t.rows(), t.k()), (m, k), "x is not [{m}, {k}]"),
        }
        match start {
            Start::Dst => {}
            Start::Bias(b) => assert_eq!(b.len(), n, "bias is not [{n}]"),
            Start::BiasResidual(b, r) => {
                assert_eq!(b.len(), n, "bias is not [{n}]");
                assert_eq!(r.len(), m * n, "residual is not [{m}, {n}]");
            }
        }
        match out {
            Output::Rows(d) => {
                assert_eq!(d.len(), m * n, "dst is not [{m}, {n}]");
                Dest {
                    ptr: SendPtr(d.as_mut_ptr()),
                    tiled: false,
                    ld: n,
                }
            }
            Output::Tiled(t) => {
                if matches!(start, Start::Dst) {
                    assert_eq!((t.rows(), t.k()), (m, n), "dst is not [{m}, {n}]");
                } else {
                    t.reshape(m, n);
                }
                let ld = t.tile_len();
                Dest {
                    ptr: SendPtr(t.as_mut_ptr()),
                    tiled: true,
                    ld,
                }
            }
        }
    }

    /// Offset of `(r, c)` for `r` at a tile's first row (a multiple of
    /// [`MR`]) and `c` at a panel's first column.
    fn base(self, r: usize, c: usize) -> usize {
        if self.tiled {
            r / MR * self.ld + c / 8 * MR * 8
        } else {
            r * self.ld + c
        }
    }

    /// (row stride, half stride).
    fn strides(self) -> (usize, usize) {
        if self.tiled {
            (8, MR * 8)
        } else {
            (self.ld, 8)
        }
    }
}

/// The activations of [`F32Matrix::matmul`].
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Row major `[m, k]` (regrouped by the call).
    Rows(&'a [f32]),
    /// Already regrouped.
    Tiled(&'a TiledRows),
}

/// The destination of [`F32Matrix::matmul`].
pub enum Output<'a> {
    /// Row major `[m, n]`.
    Rows(&'a mut [f32]),
    /// Regrouped by tiles, as the input of another [`F32Matrix`].
    Tiled(&'a mut TiledRows),
}

/// Where the sums of [`F32Matrix::matmul`] start.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// The destination's values (`dst += x W^T`).
    Dst,
    /// A bias `[n]`.
    Bias(&'a [f32]),
    /// A bias `[n]` plus a row-major residual `[m, n]` (added first).
    BiasResidual(&'a [f32], &'a [f32]),
}

/// A function applied to [`F32Matrix::matmul`]'s sums before they are
/// stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    /// `x (1 + erf(x / sqrt 2)) / 2` ([`crate::math::gelu_erf`], the same
    /// bits).
    GeluErf,
}

/// Largest packed activation buffer kept for the next call (see
/// [`crate::with_scratch`]).
const KEEP_PACKED_BYTES: usize = 16 << 20;

thread_local! {
    /// The regrouped activations of the last call on this thread.
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
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

    /// Bias, residual and GELU in the kernel give the bits of the separate
    /// passes they replace (the sums start from `residual + bias`; GELU is
    /// the scalar function's operations), and tiled inputs and outputs
    /// hold the same values as rows.
    #[test]
    fn fused_starts_gelu_and_tiles_equal_the_separate_passes() {
        if !F32Matrix::is_supported() {
            return;
        }
        for (m, n, k) in [(13, 70, 33), (50, 384, 96), (6, 16, 8), (1, 8, 260)] {
            let (x, w) = (seeded(m * k, 11), seeded(n * k, 12));
            let (bias, residual) = (seeded(n, 13), seeded(m * n, 14));
            let mat = F32Matrix::new(&w, n, k).unwrap();
            let mut want = residual.clone();
            for row in want.chunks_mut(n) {
                row.iter_mut().zip(&bias).for_each(|(v, b)| *v += b);
            }
            mat.matmul_acc(&x, m, &mut want);
            let want_gelu: Vec<f32> = want
                .iter()
                .map(|&v| crate::math::gelu_erf::<true>(v))
                .collect();
            let mut got = vec![f32::NAN; m * n];
            let start = Start::BiasResidual(&bias, &residual);
            mat.matmul(
                Input::Rows(&x),
                m,
                start,
                Activation::None,
                Output::Rows(&mut got),
            );
            assert_eq!(got, want, "[{m}, {n}, {k}] bias + residual");
            let mut tiled_x = TiledRows::new();
            tiled_x.pack(&x, k);
            assert_eq!(tiled_x.to_rows(), x);
            let mut tiled = TiledRows::new();
            let act = Activation::GeluErf;
            mat.matmul(
                Input::Tiled(&tiled_x),
                m,
                start,
                act,
                Output::Tiled(&mut tiled),
            );
            assert_eq!((tiled.rows(), tiled.k()), (m, n));
            assert_eq!(tiled.to_rows(), want_gelu, "[{m}, {n}, {k}] GELU, tiled");
            // Bias alone, then accumulating onto a tiled destination.
            let mut only_bias = vec![0f32; m * n];
            let start = Start::Bias(&bias);
            mat.matmul(
                Input::Rows(&x),
                m,
                start,
                Activation::None,
                Output::Rows(&mut only_bias),
            );
            let mut twice = TiledRows::new();
            twice.pack(&only_bias, n);
            mat.matmul(
                Input::Tiled(&tiled_x),
                m,
                Start::Dst,
                act,
                Output::Tiled(&mut twice),
            );
            let mut want_twice = only_bias.clone();
            mat.matmul_acc(&x, m, &mut want_twice);
            want_twice
                .iter_mut()
                .for_each(|v| *v = crate::math::gelu_erf::<true>(*v));
            assert_eq!(twice.to_rows(), want_twice, "[{m}, {n}, {k}] accumulated");
        }
    }

    #[test]
    fn tile_offsets_address_the_regrouped_rows() {
        let (m, k) = (13, 21);
        let x = seeded(m * k, 15);
        let mut t = TiledRows::new();
        t.pack(&x, k);
        let index = t.index();
        let p = t.as_mut_ptr();
        for r in 0..m {
            for c in 0..k {
                // SAFETY: `offset` is within the buffer (it checks the
                // bounds), which `t` owns and nothing else borrows.
                assert_eq!(unsafe { *p.add(index.offset(r, c)) }, x[r * k + c]);
            }
        }
        let rows: Vec<usize> = t.tiles_mut().map(|tile| tile.rows()).collect();
        assert_eq!(rows, [6, 6, 1]);
    }

    /// The AVX2 GELU gives the scalar function's bits (with FMA), over
    /// small and large values of both signs.
    #[test]
    fn vector_gelu_equals_the_scalar_one() {
        if !F32Matrix::is_supported() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            fn gelu8(x: [f32; 8]) -> [f32; 8] {
                use std::arch::x86_64::*;
                let mut out = [0f32; 8];
                // SAFETY: the arrays hold 8 values; the CPU has AVX2 and FMA.
                unsafe {
                    _mm256_storeu_ps(
                        out.as_mut_ptr(),
                        avx2::gelu_erf(_mm256_loadu_ps(x.as_ptr())),
                    )
                };
                out
            }
            let mut x = -12.0f32;
            while x < 12.0 {
                let v: [f32; 8] = std::array::from_fn(|i| x + i as f32 * 0.000_37);
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                let got = unsafe { gelu8(v) };
                let want = v.map(crate::math::gelu_erf::<true>);
                assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "{v:?}");
                x += 0.0031;
            }
            // SAFETY: as above.
            let got = unsafe { gelu8([0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0, 1e30, -1e30]) };
            assert_eq!(got[..2], [0.0; 2]);
            // x / 2 near zero.
            assert!((got[2] - 5e-31).abs() < 1e-36 && (got[3] + 5e-31).abs() < 1e-36);
            assert_eq!((got[4], got[5], got[6], got[7]), (100.0, 0.0, 1e30, 0.0));
        }
    }
}
