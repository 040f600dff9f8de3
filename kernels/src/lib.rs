//! Quantized matrix multiplication on the CPU for GGUF (GGML) block formats.
//!
//! [`QuantMatrix`] holds a weight matrix `W` of `n` rows (output features)
//! by `k` columns, built from the raw block bytes of a GGUF tensor, and
//! computes `y = x W^T` for `m` f32 activation rows ([`QuantMatrix::matmul`]).
//!
//! How:
//! - at load every format is stored with eight weight rows interleaved
//!   (`x8/`): 4- or 5-bit values with an f16 scale and offset per 32 (Q4_0,
//!   Q4_1, Q5_0, Q5_1), or 8-bit values with an f16 scale per 32 (Q8_0);
//!   the K-quants' 256-value super-blocks as eight such blocks whose
//!   factors come from their integer sub-block scales (Q4_K as 4-bit, Q5_K
//!   as 5-bit, Q6_K as signed 6-bit, Q3_K as signed 3-bit, `kquants.rs`),
//!   and Q2_K in a 2-bit layout of its own with a scale and a min per 16
//!   values (`x8/k2.rs`); the weights are reproduced exactly, in about the
//!   GGUF's bytes;
//! - the activations are quantized to 8 bits per 32 values as llama.cpp's
//!   Q8_0/Q8_1 (`act.rs`, which states the error bounds), or with one
//!   scale per 256 values as its Q8_K for Q2_K and Q3_K, for Q4_K, Q5_K
//!   and Q6_K on CPUs without AVX-512 VNNI, and for those three in
//!   prompt steps on CPUs with it ([`Format::activation_span`]; in decode
//!   steps too after [`set_batch_invariant`], which makes a row's product
//!   the same bits whatever the rows beside it), whose kernels then apply
//!   the activations' scale once per super-block;
//! - each 32-value block pair contributes `f_w d_x sum(q_w q_x) + m_w s_x`
//!   (Q6_K: one such sum per 16 values). One activation block's bytes,
//!   broadcast, meet eight weight rows in one register, so eight rows'
//!   sums come out of one chain of `vpmaddubsw` (or `vpdpbusd`) and the
//!   float work and output stores are per eight rows; tiles are one group
//!   x 1, 2 or 4 activation rows. With up to four activation rows
//!   (decoding a few sequences: a single pass over the weights, bound by
//!   memory) the kernels prefetch the weights 8 KiB ahead;
//! - kernels are picked at run time ([`Isa`]): AVX2 + FMA + F16C, with
//!   256-bit AVX-512 VNNI `vpdpbusd` where present and where they pass a
//!   start-up comparison with the AVX2 kernels ([`Isa::best`]; AVX-512
//!   CPUs without VNNI run the AVX2 code), AVX-VNNI's `vpdpbusd` on CPUs
//!   with VNNI but no AVX-512 (Intel client cores since Alder Lake:
//!   [`Isa::AvxVnni`], the 256-bit tiles for every step, checked the same
//!   way), AMX int8 tiles for prompt steps
//!   on CPUs that have them ([`Isa::Amx`], the same sums and so the same
//!   bits), and plain loops on other CPUs and non-x86 builds;
//! - output columns (weight rows) go in chunks of 16 across the rayon pool
//!   when there is enough work; [`QuantMatrix::matmul_many`] quantizes one
//!   input for several matrices and runs all their chunks in one loop.
//!
//! [`Bf16Matrix`] is the one unquantized format: an f32 layer computed
//! with bf16 inputs and f32 sums (`vdpbf16ps`) on CPUs with AVX-512 BF16,
//! for the encoders' dense layers (`bf16.rs`); on x86 CPUs with AVX2 and
//! FMA but no AVX-512 those layers run in f32 on weights packed once ([`F32Matrix`],
//! `f32fma.rs`).

mod act;
mod bf16;
mod claim;
#[cfg(test)]
mod dense_test_util;
mod f32fma;
mod formats;
mod frame;
mod huge_pages;
mod i16madd;
mod isolated;
mod kquants;
pub mod math;
mod x8;

use std::ops::Range;
use std::sync::OnceLock;

use act::Acts;
pub use bf16::Bf16Matrix;
pub use f32fma::{Activation, F32Matrix, Input, Output, Start, TileMut, TiledIndex, TiledRows};
pub use formats::{quantize_q8_0, Format};
use formats::{with_layout, Repr, QK};
pub use huge_pages::HugePageAlloc;
pub use i16madd::{I16Matrix, PackedMatrix};
use isolated::isolated;

/// Multiply-adds below which a matmul stays on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// Weight rows per unit of parallel work.
const CHUNK_ROWS: usize = 16;

/// Whether the environment variable `name` is `0`: how each of the
/// kernels' switches (`HEARTH_KERNELS_AVX512`, `HEARTH_KERNELS_AVXVNNI`,
/// `HEARTH_KERNELS_AMX`, `HEARTH_HUGE_PAGES`) leaves its feature out.
pub(crate) fn set_to_zero(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "0")
}

/// Whether this process may run the 512-bit VNNI kernels (which take
/// 32-value activation scales in decode steps for Q4_K, Q5_K and Q6_K,
/// [`Format::activation_span`]): the CPU has AVX-512 VNNI and
/// `HEARTH_KERNELS_AVX512` is not `0`; read once. With `0` the kernels
/// pick their activation scales and tiles as on a CPU without AVX-512
/// (256-value scales for those formats in every step), so that setting
/// stands in for such a CPU whole, not only for its instructions.
pub(crate) fn wide_kernels() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| Isa::Avx512Vnni.is_available() && !set_to_zero("HEARTH_KERNELS_AVX512"))
}

/// Whether each activation row's product is the same whatever the number
/// of rows in its call (see [`set_batch_invariant`]); decided on first
/// read, `false` unless set before.
pub fn batch_invariant() -> bool {
    *BATCH_INVARIANT.get_or_init(|| false)
}

static BATCH_INVARIANT: OnceLock<bool> = OnceLock::new();

/// Makes every product's result for an activation row independent of how
/// many rows share the call (a sequence's tokens then do not depend on
/// which others share its decode steps, nor on whether its prompt came in
/// a step of its own): Q4_K, Q5_K and Q6_K then take one activation scale
/// per 256 values in decode steps too, on CPUs with AVX-512 VNNI (the only
/// ones where the choice differs; [`Format::activation_span`]), whose
/// decode of K-quant models is then 6-8% slower (`benches/README.md`, `benches/HISTORY.md`).
/// The other formats, and every format elsewhere, are so already. The
/// choice is made once per process, before the first product: returns
/// whether `on` is now the setting (false if a product or an earlier call
/// fixed the other one).
pub fn set_batch_invariant(on: bool) -> bool {
    BATCH_INVARIANT.set(on).is_ok() || batch_invariant() == on
}

/// Whether the CPU says it is Intel's (CPUID leaf 0: "GenuineIntel").
#[cfg(target_arch = "x86_64")]
pub(crate) fn is_intel() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
    &vendor == b"GenuineIntel"
}

/// Whether the kernels may use AVX-VNNI: the CPU has it (with AVX2, FMA
/// and F16C) and `HEARTH_KERNELS_AVXVNNI` is not `0`; read once.
pub(crate) fn avx_vnni_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| Isa::AvxVnni.is_available() && !set_to_zero("HEARTH_KERNELS_AVXVNNI"))
}

/// An invalid matrix description (sizes, byte counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// An output buffer shared by parallel tasks that each write their own
/// elements (the callers' SAFETY notes say which).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: the tasks that share it write disjoint elements.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Runs `f` with this thread's scratch buffer from `key`, kept for the next
/// call (a fresh multi-megabyte buffer costs page faults every time) unless
/// it grew past `keep_bytes`, when it goes back to the system instead of
/// staying resident for the life of the thread. A nested call (rayon may
/// run other work while this thread waits) finds the buffer taken and
/// uses a fresh one.
pub(crate) fn with_scratch<T: 'static>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    keep_bytes: usize,
    f: impl FnOnce(&mut Vec<T>),
) {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            f(&mut buf);
            if buf.capacity() * size_of::<T>() > keep_bytes {
                *buf = Vec::new();
            }
        }
        Err(_) => f(&mut Vec::new()),
    });
}

/// An instruction set the kernels can run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable loops (any target).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-VNNI (`vpdpbusd` on 256-bit registers,
    /// VEX-encoded), for CPUs without AVX-512: the 256-bit tiles for
    /// prompt steps too.
    AvxVnni,
    /// x86-64 AVX-512 F/BW/VL (runs the AVX2 kernels).
    Avx512,
    /// [`Isa::Avx512`] plus VNNI (`vpdpbusd`).
    Avx512Vnni,
    /// [`Isa::Avx512Vnni`] plus AMX int8 tiles (`tdpbsud`) for prompt
    /// steps, where the kernel lets the process use them (Linux).
    Amx,
}

impl Isa {
    /// Whether this CPU can run the kernels of `self`.
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = || {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            };
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => {
                    std::is_x86_feature_detected!("avx2")
                        && std::is_x86_feature_detected!("fma")
                        && std::is_x86_feature_detected!("f16c")
                }
                Isa::AvxVnni => {
                    Isa::Avx2.is_available() && std::is_x86_feature_detected!("avxvnni")
                }
                Isa::Avx512 => avx512(),
                Isa::Avx512Vnni => avx512() && std::is_x86_feature_detected!("avx512vnni"),
                Isa::Amx => Isa::Avx512Vnni.is_available() && x8::amx::available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }

    /// Every instruction set this CPU can run, scalar first.
    pub fn available() -> Vec<Isa> {
        [
            Isa::Scalar,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Avx512Vnni,
            Isa::Amx,
        ]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
    }

    /// The instruction set [`QuantMatrix::matmul`] uses (detected once).
    ///
    /// AVX2 where available, else scalar; AVX-512 VNNI where the CPU has it
    /// and its kernels give the AVX2 kernels' results on a set of test
    /// matrices ([`Isa::self_check`]). The VNNI kernels were written on a
    /// machine without AVX-512, so they are checked on the CPU that runs
    /// them before they are trusted; a mismatch falls back to AVX2 with a
    /// message on stderr. `HEARTH_KERNELS_AVX512=0` leaves AVX-512 out,
    /// `HEARTH_KERNELS_AVX512=1` takes the best available without the
    /// check. AVX-512 without VNNI runs the AVX2 kernels either way. AMX
    /// tiles are taken the same way, checked first, where the CPU and the
    /// kernel offer them; `HEARTH_KERNELS_AMX=0` leaves them out. Without
    /// AVX-512 VNNI (or with `HEARTH_KERNELS_AVX512=0`), AVX-VNNI where the
    /// CPU has it, checked the same way; `HEARTH_KERNELS_AVXVNNI=0` leaves
    /// it out.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let setting = std::env::var("HEARTH_KERNELS_AVX512").ok();
            let no_amx = set_to_zero("HEARTH_KERNELS_AMX");
            let base = if Isa::Avx2.is_available() {
                Isa::Avx2
            } else {
                Isa::Scalar
            };
            let usable = |isa: Isa| {
                isa.is_available()
                    && !(no_amx && isa == Isa::Amx)
                    && (isa != Isa::AvxVnni || avx_vnni_allowed())
            };
            let checked = |isa: Isa| {
                let checked = isolated(|| isa.self_check(base))
                    .unwrap_or_else(|| Err(Error("the check did not run".into())));
                if let Err(e) = &checked {
                    eprintln!("hearth-kernels: {isa:?} kernels not used: {e}");
                }
                checked.is_ok()
            };
            let candidates: &[Isa] = match setting.as_deref() {
                Some("0") => &[Isa::AvxVnni],
                Some("1") => {
                    return Isa::available()
                        .into_iter()
                        .rev()
                        .find(|&i| usable(i))
                        .expect("scalar is always available")
                }
                _ => &[Isa::Amx, Isa::Avx512Vnni, Isa::AvxVnni],
            };
            candidates
                .iter()
                .copied()
                .filter(|&i| usable(i))
                .find(|&i| checked(i))
                .unwrap_or(base)
        })
    }

    /// Runs `self`'s kernels against `base`'s on small matrices of every
    /// format (random blocks; 20 rows, a padded last group, and 32; every
    /// tile height from 1 to 9 activation rows, and 17 and 40 rows, where
    /// prompt steps' tiles run); an error names the first
    /// mismatch. The integer sums are exact, so the two must agree to f32
    /// rounding (`1e-5` of the sum of the products' magnitudes).
    ///
    /// # Panics
    /// If either instruction set is not available on this CPU.
    pub fn self_check(self, base: Isa) -> Result<(), Error> {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // 20 rows: a padded last group (the activations in row order); 32:
        // the activations regrouped by tiles.
        for (n, format) in [20, 32]
            .into_iter()
            .flat_map(|n| Format::ALL.map(|f| (n, f)))
        {
            let (bb, bv) = (format.block_bytes(), format.block_values());
            let k = 3 * bv;
            let mut bytes: Vec<u8> = (0..n * k / bv * bb).map(|_| next() as u8).collect();
            // The f16 scales (and offsets): small values. The rest of each
            // block (values, integer sub-block scales) stays random.
            let f16s: &[(usize, f32)] = match format {
                Format::Q4_1 | Format::Q5_1 => &[(0, 1e-3), (2, -1e-2)],
                Format::Q4K | Format::Q5K => &[(0, 1e-4), (2, 1e-4)],
                Format::Q2K => &[(80, 1e-4), (82, 1e-4)],
                Format::Q3K => &[(108, 1e-4)],
                Format::Q6K => &[(208, 1e-5)],
                _ => &[(0, 1e-3)],
            };
            for block in bytes.chunks_exact_mut(bb) {
                for &(at, unit) in f16s {
                    let v = half::f16::from_f32(unit * (1 + next() % 64) as f32);
                    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            let w = QuantMatrix::new(format, &bytes, n, k)?;
            let deq = w.dequantize();
            // 17 and 40 rows: AMX tiles (16 rows) and the rest.
            for m in (1..=9).chain([17, 40]) {
                let x: Vec<f32> = (0..m * k)
                    .map(|_| (next() % 2001) as f32 / 100.0 - 10.0)
                    .collect();
                let (mut got, mut want) = (vec![0f32; m * n], vec![0f32; m * n]);
                w.matmul_with(self, &x, m, &mut got);
                w.matmul_with(base, &x, m, &mut want);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    // Relative to the sum of the products' magnitudes: f32
                    // summation order may differ between the two.
                    let (row, col) = (i / n, i % n);
                    let mag: f32 = deq[col * k..][..k]
                        .iter()
                        .zip(&x[row * k..][..k])
                        .map(|(w, x)| (w * x).abs())
                        .sum();
                    if (g - e).abs() > 1e-5 * mag + 1e-6 {
                        return Err(Error(format!(
                            "{format:?}, {m} rows: output {i} is {g} with {self:?}, {e} with {base:?}"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A quantized weight matrix `[n, k]` (row `r` is output feature `r`).
#[derive(Debug)]
pub struct QuantMatrix {
    format: Format,
    n: usize,
    k: usize,
    repr: Repr,
}

impl QuantMatrix {
    /// From the GGUF block bytes of `n` rows of `k` values each (`k` a
    /// multiple of [`Format::block_values`]); the bytes are copied.
    pub fn new(format: Format, data: &[u8], n: usize, k: usize) -> Result<Self, Error> {
        let repr = formats::unpack(format, data, n, k)?;
        Ok(Self { format, n, k, repr })
    }

    /// Quantizes f32 weights `[n, k]` (row major, `k % 32 == 0`) to Q8_0.
    pub fn from_f32_q8_0(w: &[f32], n: usize, k: usize) -> Result<Self, Error> {
        if w.len() != n * k || !k.is_multiple_of(QK) {
            return Err(Error(format!(
                "{} values for a [{n}, {k}] Q8_0 matrix",
                w.len()
            )));
        }
        Self::new(Format::Q8_0, &quantize_q8_0(w), n, k)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Rows (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weights as f32, `[n, k]` row major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        self.repr.dequantize_rows(0..self.n, &mut out);
        out
    }

    /// Appends row `r` (`k` values) as f32: one token's embedding when the
    /// matrix is a token table.
    ///
    /// # Panics
    /// If `r >= n`.
    pub fn dequantize_row(&self, r: usize, out: &mut Vec<f32>) {
        assert!(r < self.n, "row {r} of a matrix of {} rows", self.n);
        self.repr.dequantize_rows(r..r + 1, out)
    }

    /// `out = x W^T`: `x` is `[m, k]` and `out` `[m, n]`, row major, with
    /// the fastest instruction set of this CPU.
    ///
    /// # Panics
    /// If the slice lengths do not match the shapes.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_with(Isa::best(), x, m, out)
    }

    /// [`QuantMatrix::matmul`] with a given instruction set (tests, timing).
    ///
    /// # Panics
    /// If `isa` is not available on this CPU or the lengths do not match.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        Self::matmul_many_with(isa, &mut [(self, out)], x, m)
    }

    /// `out_i = x W_i^T` for several matrices over the same input (the
    /// query/key/value projections of a layer, say), `x` `[m, k]` and
    /// `out_i` `[m, n_i]`: the input is quantized once, and the chunks of all
    /// matrices share one parallel loop.
    ///
    /// # Panics
    /// If a matrix's `k` or an output's length does not match.
    pub fn matmul_many(mats: &mut [(&QuantMatrix, &mut [f32])], x: &[f32], m: usize) {
        Self::matmul_many_with(Isa::best(), mats, x, m)
    }

    /// [`QuantMatrix::matmul_many`], and `side(0)`, ..., `side(sides - 1)`
    /// run as more items of the same parallel loop, before the matrices'
    /// chunks: small independent tasks (a LoRA adapter's low-rank deltas
    /// of the same input, say) that the pool's threads share with the
    /// chunks, one thread starting on them while the others take chunks,
    /// instead of one thread held apart for them.
    ///
    /// # Panics
    /// As [`QuantMatrix::matmul_many`].
    pub fn matmul_many_beside(
        mats: &mut [(&QuantMatrix, &mut [f32])],
        x: &[f32],
        m: usize,
        sides: usize,
        side: &(dyn Fn(usize) + Sync),
    ) {
        Self::matmul_many_inner(Isa::best(), mats, x, m, sides, side)
    }

    /// [`QuantMatrix::matmul_many`] with a given instruction set.
    ///
    /// # Panics
    /// As [`QuantMatrix::matmul_with`].
    pub fn matmul_many_with(
        isa: Isa,
        mats: &mut [(&QuantMatrix, &mut [f32])],
        x: &[f32],
        m: usize,
    ) {
        Self::matmul_many_inner(isa, mats, x, m, 0, &|_| {})
    }

    fn matmul_many_inner(
        isa: Isa,
        mats: &mut [(&QuantMatrix, &mut [f32])],
        x: &[f32],
        m: usize,
        sides: usize,
        side: &(dyn Fn(usize) + Sync),
    ) {
        assert!(isa.is_available(), "{isa:?} is not available on this CPU");
        let Some(k) = mats.first().map(|(w, _)| w.k) else {
            (0..sides).for_each(side);
            return;
        };
        assert_eq!(x.len(), m * k, "x is not [{m}, {k}]");
        for (w, out) in mats.iter() {
            assert_eq!(w.k, k, "matrices of different input sizes");
            assert_eq!(out.len(), m * w.n, "out is not [{m}, {}]", w.n);
        }
        if m == 0 {
            (0..sides).for_each(side);
            return;
        }
        // The input quantized once per activation span the matrices want.
        let span_of = |w: &QuantMatrix| w.format.activation_span(m);
        // The 512-bit prefill kernels read the rows regrouped by tiles,
        // where every matrix runs on them alone.
        #[cfg(target_arch = "x86_64")]
        let tiled = matches!(isa, Isa::Avx512Vnni | Isa::Amx)
            && mats.iter().all(|(w, _)| x8::wide::reads_tiles(m, w.n));
        #[cfg(not(target_arch = "x86_64"))]
        let tiled = false;
        // With AMX, tiles of 16 rows where every matrix of the span runs
        // on AMX tiles.
        let tiles16 = |span: usize| {
            #[cfg(target_arch = "x86_64")]
            return isa == Isa::Amx
                && mats
                    .iter()
                    .filter(|(w, _)| span_of(w) == span)
                    .all(|(w, _)| with_layout!(&w.repr, l => x8::amx::takes(l)));
            #[cfg(not(target_arch = "x86_64"))]
            false
        };
        let quantized = |span: usize| {
            mats.iter().any(|(w, _)| span_of(w) == span).then(|| {
                if tiled {
                    Acts::quantize_tiled(x, k, span, tiles16(span))
                } else {
                    Acts::quantize(x, k, span)
                }
            })
        };
        let (acts32, acts256) = (quantized(QK), quantized(256));
        // Weight rows per chunk (the tiled kernels may take more at once).
        let chunk_rows = |w: &QuantMatrix| {
            #[cfg(target_arch = "x86_64")]
            if tiled && isa == Isa::Avx512Vnni {
                return x8::wide::tiled_chunk_rows(w.format, w.n);
            }
            let _ = w; // read only by the x86-64 kernels
            CHUNK_ROWS
        };
        // Chunk `(i, ci)` owns weight rows (output columns) `r ci..r ci +
        // r` of matrix `i` (`r = chunk_rows(w_i)`) and writes only those
        // columns of `out_i`.
        let mut chunks = Vec::new();
        let mut work_size = 0;
        let targets: Vec<(&QuantMatrix, Out)> = mats
            .iter_mut()
            .enumerate()
            .map(|(i, (w, out))| {
                chunks.extend((0..w.n.div_ceil(chunk_rows(w))).map(|ci| (i, ci)));
                work_size += m * w.n * k;
                let out = Out {
                    ptr: out.as_mut_ptr(),
                    n: w.n,
                    m,
                };
                (&**w, out)
            })
            .collect();
        let work = |&(i, ci): &(usize, usize)| {
            let (w, out) = targets[i];
            let r = chunk_rows(w);
            let r0 = ci * r;
            let acts = if span_of(w) == QK { &acts32 } else { &acts256 };
            let acts = acts.as_ref().expect("quantized for every span in use");
            // SAFETY: chunks have disjoint row ranges of their matrix, so no
            // two write the same element; the outputs outlive the calls (all
            // end before return).
            unsafe { w.block(isa, acts, r0..(r0 + r).min(w.n), out) };
        };
        if work_size >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1 {
            let item = |i: usize| match i.checked_sub(sides) {
                None => side(i),
                Some(c) => work(&chunks[c]),
            };
            // Each thread a contiguous run of the items (the side tasks
            // at the front of the first), then what is left of the
            // others' runs one item at a time from their ends: rayon's
            // own pieces left a thread with a quarter of the chunks in one
            // piece nobody could take from it (decode 1.02-1.05x; with an
            // adapter at one stream, against pieces of eight items, about
            // 1.02x; `benches/README.md`, `benches/HISTORY.md`).
            claim::for_each_claimed(sides + chunks.len(), rayon::current_num_threads(), &item);
        } else {
            (0..sides).for_each(side);
            chunks.iter().for_each(work);
        }
    }

    /// Weight rows `rows` times every activation row into columns `rows` of
    /// `out`.
    ///
    /// # Safety
    /// No other thread writes columns `rows` of `out` meanwhile, and `out`'s
    /// buffer is alive.
    unsafe fn block(&self, isa: Isa, acts: &Acts, rows: Range<usize>, out: Out) {
        assert_eq!(
            acts.span,
            self.format.activation_span(acts.rows()),
            "activations of another span"
        );
        let groups = groups(rows);
        match isa {
            Isa::Scalar => with_layout!(&self.repr, w => x8::run_scalar(w, acts, groups, out)),
            // SAFETY (both arms below): `matmul_with` checked that the CPU
            // has `isa`; every non-scalar `Isa` implies AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                with_layout!(&self.repr, w => x8::simd::run_vnni::<_, false>(w, acts, groups, out))
            }
            // SAFETY: as above; `Amx` is available only where
            // `x8::amx::available`.
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => {
                with_layout!(&self.repr, w => x8::simd::run_vnni::<_, true>(w, acts, groups, out))
            }
            // SAFETY: as above; `AvxVnni` adds AVX-VNNI, checked there.
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => {
                with_layout!(&self.repr, w => x8::simd::run_avxvnni(w, acts, groups, out))
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => {
                with_layout!(&self.repr, w => x8::simd::run_avx2(w, acts, groups, out))
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar kernels exist off x86-64"),
        }
    }
}

/// The row groups of the interleaved layouts (`x8/`) that hold weight rows `rows` (whose
/// start is a multiple of the group size).
fn groups(rows: Range<usize>) -> Range<usize> {
    debug_assert!(rows.start.is_multiple_of(x8::G) && CHUNK_ROWS.is_multiple_of(x8::G));
    rows.start / x8::G..rows.end.div_ceil(x8::G)
}

/// The `[m, n]` output of one matmul, shared by its chunks, each of which
/// writes only the columns of its own weight rows.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    n: usize,
    m: usize,
}

// SAFETY: an `Out` is only written through `put`, whose callers own disjoint
// columns (see `QuantMatrix::block`).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// Where columns `r..r + cols` of output row `a` start.
    ///
    /// # Panics
    /// If they are outside the output.
    fn row(&self, r: usize, a: usize, cols: usize) -> *mut f32 {
        assert!(r + cols <= self.n && a < self.m, "tile outside the output");
        // SAFETY: in bounds (asserted).
        unsafe { self.ptr.add(a * self.n + r) }
    }

    /// Stores a tile: `t[i][j]` goes to `out[a + j][r + i]`.
    ///
    /// # Safety
    /// Columns `r..r + R` belong to the caller (no concurrent writer) and
    /// the buffer is alive.
    unsafe fn put<const R: usize, const A: usize>(&self, r: usize, a: usize, t: [[f32; A]; R]) {
        assert!(
            r + R <= self.n && a + A <= self.m,
            "tile outside the output"
        );
        for (i, row) in t.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                // SAFETY: in bounds (asserted); exclusive by the contract.
                unsafe { *self.ptr.add((a + j) * self.n + r + i) = v };
            }
        }
    }
}
