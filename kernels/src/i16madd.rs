//! Dense layers with 16-bit integer products on CPUs with AVX2, for the
//! encoders' `int16` arithmetic.
//!
//! [`I16Matrix`] holds `W` (`[n, k]`) rounded to integers of at most
//! [`W_MAX`] in magnitude with one f32 scale per output column, in panels
//! of 16 columns: for each pair of inputs, the 16 columns' two weights side
//! by side (64 bytes, one cache line, two registers). [`I16Matrix::matmul`]
//! rounds each activation row to integers of at most [`A_MAX`] with one
//! scale per row, regrouped by the f32 kernel's tiles of 6 rows, and
//! computes the products with `vpmaddwd`: 16 products and 8 pairwise sums
//! per instruction, twice the multiply-adds of an f32 FMA (on AMD Zen 3 two
//! of them per cycle, as for FMAs, plus an integer add each to accumulate).
//! The tiles, the tasks, the prefetching and the epilogue (the sums start
//! from the destination, a bias or a bias plus a residual and may leave
//! through GELU) are the f32 kernel's ([`crate::F32Matrix`]); the inputs
//! and outputs are the same [`Input`]/[`Output`]s. Where the CPU has
//! AVX-VNNI the products and their adds are one `vpdpwssd`; where it has
//! AVX-512 VNNI a line is one 512-bit register and one `vpdpwssd` covers a
//! row's 16 columns (`avx512.rs`, with the GELU on 16 lanes): the same
//! sums and epilogue, so the same bits on every path ([`Madd`]).
//!
//! The integer sums are exact: with `|a| <= A_MAX` and `|w| <= W_MAX` a
//! pass of [`KC`] inputs cannot overflow an i32, and each pass's sum
//! enters the f32 result as `sum * w_scale * a_scale` (one multiply and one
//! FMA from the start value). The only rounding is the inputs': 13 bits
//! for activations, 12 for weights, relative to the row's and the column's
//! largest magnitude; on all-MiniLM-L6-v2 the embeddings stay within the
//! bounds of the bf16 arithmetic (`crates/engine/tests/minilm_fixture.rs`).

use crate::f32fma::tiled::tile_len;
use crate::f32fma::{for_each_task, Dest, MR, NR};
use crate::{Activation, Error, Input, Output, Start};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Largest activation magnitude after rounding (13 bits).
pub const A_MAX: i32 = 4095;
/// Largest weight magnitude after rounding (12 bits).
pub const W_MAX: i32 = 2047;
/// Inputs per exact integer pass (the f32 kernel's pass).
const KC: usize = crate::f32fma::KC;
const _: () = assert!(KC as i64 * A_MAX as i64 * W_MAX as i64 <= i32::MAX as i64);

/// Two inputs' weights for a panel's 16 columns: lanes `2 c`, `2 c + 1` of
/// half `c / 8` hold column `c`'s (one `vpmaddwd` operand per half).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct Line([i16; 2 * NR]);

/// A weight matrix `[n, k]` for `y += x W^T` with integer products (see
/// the module docs).
#[derive(Debug, Clone)]
pub struct I16Matrix {
    n: usize,
    k: usize,
    /// Panel `j`, inputs `2 p, 2 p + 1` at `j * pairs + p`, with `pairs`
    /// for `k` rounded up to 8; columns past `n` and inputs past `k` are
    /// zero.
    panels: Vec<Line>,
    /// Per column, `n` rounded up to 16 (zero past `n`).
    scales: Vec<f32>,
}

impl I16Matrix {
    /// Whether this CPU runs [`I16Matrix::matmul`] (AVX2 and FMA).
    pub fn is_supported() -> bool {
        crate::F32Matrix::is_supported()
    }

    /// Rounds and packs `w` (`[n, k]`, row major).
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self, Error> {
        if w.len() != n * k || n == 0 || k == 0 {
            return Err(Error(format!(
                "{} values for a [{n}, {k}] int16 matrix",
                w.len()
            )));
        }
        let pairs = pairs(k);
        let mut panels = vec![Line([0; 2 * NR]); n.div_ceil(NR) * pairs];
        let mut scales = vec![0f32; n.div_ceil(NR) * NR];
        for (c, row) in w.chunks(k).enumerate() {
            let (scale, inv) = scale_of(row, W_MAX);
            scales[c] = scale;
            let panel = &mut panels[c / NR * pairs..][..pairs];
            let lane = (c % NR / 8) * 16 + (c % 8) * 2;
            for (q, &v) in row.iter().enumerate() {
                panel[q / 2].0[lane + q % 2] = round(v, inv, W_MAX) as i16;
            }
        }
        Ok(Self {
            n,
            k,
            panels,
            scales,
        })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weights as the kernel multiplies them (rounded, times their
    /// column's scale), `[n, k]` row major.
    pub fn weights(&self) -> Vec<f32> {
        let pairs = pairs(self.k);
        let mut w = vec![0f32; self.n * self.k];
        for (c, row) in w.chunks_mut(self.k).enumerate() {
            let panel = &self.panels[c / NR * pairs..][..pairs];
            let lane = (c % NR / 8) * 16 + (c % 8) * 2;
            for (q, v) in row.iter_mut().enumerate() {
                *v = f32::from(panel[q / 2].0[lane + q % 2]) * self.scales[c];
            }
        }
        w
    }

    /// `dst[m, n] += x[m, k] . W^T`, across the rayon pool.
    ///
    /// # Panics
    /// As [`I16Matrix::matmul`].
    pub fn matmul_acc(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        let (start, act) = (Start::Dst, Activation::None);
        self.matmul(Input::Rows(x), m, start, act, Output::Rows(dst));
    }

    /// `out[m, n] = act(start + x[m, k] . W^T)` with the activations
    /// rounded per row, across the rayon pool. A tiled output is shaped
    /// `[m, n]` by the call (with [`Start::Dst`] it must already be).
    ///
    /// # Panics
    /// If the CPU lacks AVX2 or FMA ([`I16Matrix::is_supported`]) or the
    /// shapes do not match.
    pub fn matmul(&self, x: Input, m: usize, start: Start, act: Activation, out: Output) {
        self.matmul_with(Madd::best(), x, m, start, act, out)
    }

    /// [`I16Matrix::matmul`] with the products of `madd` (all give the
    /// same sums, so the same bits).
    ///
    /// # Panics
    /// As [`I16Matrix::matmul`], and if the CPU lacks `madd`'s
    /// instructions.
    pub(crate) fn matmul_with(
        &self,
        madd: Madd,
        x: Input,
        m: usize,
        start: Start,
        act: Activation,
        out: Output,
    ) {
        assert!(Self::is_supported(), "this CPU has no AVX2 and FMA");
        assert!(madd.is_available(), "this CPU has no {madd:?}");
        let out = Dest::prepare(&x, (m, self.n, self.k), &start, out);
        if m == 0 {
            return;
        }
        crate::with_scratch(&QUANT, KEEP_BYTES, |q| {
            crate::with_scratch(&SCALES, KEEP_BYTES, |s| {
                quantize(x, m, self.k, q, s);
                self.run(madd, q, s, out, start, act, m);
            })
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        madd: Madd,
        q: &[i32],
        s: &[f32],
        out: Dest,
        start: Start,
        act: Activation,
        m: usize,
    ) {
        let (k, pairs, tile_len) = (self.k, pairs(self.k), tile_len(self.k) / 2);
        assert!(q.len() >= m.div_ceil(MR) * tile_len && s.len() >= m);
        for_each_task(m, self.n, start, |rows, cols, init| {
            let panel = &self.panels[cols.start / NR * pairs..][..pairs];
            let scales = &self.scales[cols.start..][..NR];
            #[cfg(target_arch = "x86_64")]
            {
                let tiles = avx2::I16Tiles::<false> {
                    a: q.as_ptr(),
                    tile_len,
                    a_scales: s.as_ptr(),
                    panel: panel.as_ptr().cast(),
                    w_scales: scales.as_ptr(),
                };
                let gelu = act == Activation::GeluErf;
                // SAFETY (each arm): the CPU has `madd`'s instructions
                // (asserted by `matmul_with`; AVX2 and FMA for all); `q`
                // holds the rounded tiles of `m` rows of `k` and `s` their
                // scales (checked above), the panel the pairs of `k`
                // rounded up to 8 and the scales 16 columns; `out`, the
                // bias and the residual cover `[m, n]` in their layouts
                // (checked by `matmul_with`); each task writes only its
                // own rows x columns, so no two tasks touch the same
                // element.
                use crate::f32fma::avx2 as f;
                match madd {
                    Madd::Avx2 => unsafe { f::block(tiles, k, out, init, gelu, rows, cols) },
                    Madd::AvxVnni => unsafe {
                        f::block_avxvnni(tiles.with_vnni(), k, out, init, gelu, rows, cols)
                    },
                    Madd::Avx512Vnni => unsafe {
                        let tiles = avx512::I16WideTiles(tiles);
                        f::block_avx512vnni(tiles, k, out, init, gelu, rows, cols)
                    },
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (
                madd, q, s, panel, scales, out, rows, cols, init, act, k, tile_len,
            );
        });
    }
}

/// The instructions that multiply and add the integer pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Madd {
    /// `vpmaddwd` and `vpaddd` on 256-bit registers (AVX2).
    Avx2,
    /// AVX-VNNI's `vpdpwssd` on 256-bit registers.
    AvxVnni,
    /// AVX-512 VNNI's `vpdpwssd` on 512-bit registers: a row's 16 columns
    /// in one register.
    Avx512Vnni,
}

impl Madd {
    /// The widest this process may use: AVX-512 VNNI unless
    /// `HEARTH_KERNELS_AVX512=0` ([`crate::wide_kernels`]), else AVX-VNNI
    /// unless `HEARTH_KERNELS_AVXVNNI=0`, else AVX2.
    fn best() -> Madd {
        if crate::wide_kernels() {
            Madd::Avx512Vnni
        } else if crate::avx_vnni_allowed() {
            Madd::AvxVnni
        } else {
            Madd::Avx2
        }
    }

    /// Whether this CPU has the instructions (with AVX2 and FMA).
    pub(crate) fn is_available(self) -> bool {
        use crate::Isa;
        match self {
            Madd::Avx2 => I16Matrix::is_supported(),
            Madd::AvxVnni => I16Matrix::is_supported() && Isa::AvxVnni.is_available(),
            Madd::Avx512Vnni => I16Matrix::is_supported() && Isa::Avx512Vnni.is_available(),
        }
    }
}

/// Weight pairs per panel for inputs of `k` (rounded up to 8).
fn pairs(k: usize) -> usize {
    k.next_multiple_of(8) / 2
}

/// The scale of values whose largest magnitude becomes `max`, and its
/// inverse (zero for all-zero values).
fn scale_of(values: &[f32], max: i32) -> (f32, f32) {
    let top = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    scale_for(top, max)
}

/// [`scale_of`] for a largest magnitude `top`.
fn scale_for(top: f32, max: i32) -> (f32, f32) {
    if top > 0.0 {
        (top / max as f32, max as f32 / top)
    } else {
        (0.0, 0.0)
    }
}

/// `v` rounded to the integers of `inv` (to nearest, ties to even, as
/// `vcvtps2dq` does), within `max`.
fn round(v: f32, inv: f32, max: i32) -> i32 {
    ((v * inv).round_ties_even() as i32).clamp(-max, max)
}

/// Rounds the rows of `x` into `q` (tiles of [`MR`] rows, each pair of
/// inputs' rows side by side as two i16 in an i32) and their scales into
/// `s`, across the rayon pool.
fn quantize(x: Input, m: usize, k: usize, q: &mut Vec<i32>, s: &mut Vec<f32>) {
    use rayon::prelude::*;
    // Two values per i32 (the pairs `vpmaddwd` takes).
    let (f32_len, len) = (tile_len(k), tile_len(k) / 2);
    let tiles = m.div_ceil(MR);
    q.resize(tiles * len, 0);
    s.resize(tiles * MR, 0.0);
    // Rows apart, groups of 8 values apart.
    let (rs, gs) = match x {
        Input::Rows(_) => (k, 8),
        Input::Tiled(_) => (8, MR * 8),
    };
    q.par_chunks_mut(len)
        .zip(s.par_chunks_mut(MR))
        .enumerate()
        .for_each(|(t, (q, s))| {
            let rows = MR.min(m - t * MR);
            let src = match x {
                Input::Rows(x) => x[t * MR * k..].as_ptr(),
                Input::Tiled(x) => x.data[t * f32_len..].as_ptr(),
            };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX2 and FMA (asserted by `matmul`); the
            // tile's `rows` rows of `k` lie at `src` with these strides
            // (the input's shape is checked by `matmul`); `q` and `s` are
            // this tile's.
            unsafe {
                avx2::quantize_tile(src, rs, gs, k, rows, q, s)
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (src, rs, gs, rows, q, s);
        });
}

/// A matrix of either kernel that takes tiled inputs and fused starts
/// ([`crate::F32Matrix`], [`I16Matrix`]), for callers that run one or the
/// other by their precision.
#[derive(Debug, Clone, Copy)]
pub enum PackedMatrix<'a> {
    F32(&'a crate::F32Matrix),
    I16(&'a I16Matrix),
}

impl PackedMatrix<'_> {
    /// The matrix's `matmul` ([`crate::F32Matrix::matmul`],
    /// [`I16Matrix::matmul`]).
    pub fn matmul(self, x: Input, m: usize, start: Start, act: Activation, out: Output) {
        match self {
            PackedMatrix::F32(w) => w.matmul(x, m, start, act, out),
            PackedMatrix::I16(w) => w.matmul(x, m, start, act, out),
        }
    }
}

/// Largest rounded-activation and scale buffers kept for the next call
/// (see [`crate::with_scratch`]): the feed-forward input of a batch of
/// 8192 tokens of a 1536-wide layer takes 25 MB.
const KEEP_BYTES: usize = 32 << 20;

thread_local! {
    /// The rounded activations of the last call on this thread.
    static QUANT: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Their scales.
    static SCALES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests;
