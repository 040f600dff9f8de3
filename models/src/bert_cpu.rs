//! BERT layers on plain f32 slices, for f32 weights on the CPU.
//!
//! The candle path of a layer (`bert.rs`) is four matmuls plus a dozen
//! whole-matrix passes around them: each bias is a broadcast add over the
//! matmul's output, each residual another add, the QKV and FFN activations
//! are copied out of and back into tensors for attention and GELU. Here
//! the biases and residuals are written into the destination first and the
//! matmul accumulates onto it (`gemm` with `read_dst`, the same GEMM candle
//! calls), LayerNorm runs in place over rows in parallel, and GELU runs in
//! place on the FFN activations: the only full passes left are the ones
//! that compute something.
//!
//! The dense layers run in f32 (on CPUs with AVX2 and FMA but no AVX-512,
//! on weights packed once at load: [`hearth_kernels::F32Matrix`]), with
//! bf16 inputs and f32 sums on CPUs that multiply bf16 natively, or with
//! integer products on AVX2 CPUs ([`hearth_kernels::I16Matrix`], the
//! default on those without AVX-512) ([`EncoderPrecision`]).
//!
//! On the packed f32 or int16 kernel a layer goes further
//! ([`CpuLayer::forward_tiled`]): the kernel starts its sums from the bias
//! (and residual) and applies GELU as it stores them, and each matrix's
//! input is written regrouped by the kernel's tiles by the step before it
//! (attention, the LayerNorms, the first feed-forward matrix), so only
//! attention and the LayerNorms pass over the activations.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use hearth_kernels::{Activation, I16Matrix, Input, Output, PackedMatrix, Start, TiledRows};

use crate::packed_attention::{
    packed_attention_into, packed_attention_rows, packed_attention_tiled,
};
use crate::vecmath;

/// The arithmetic of an encoder's dense layers on the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EncoderPrecision {
    /// bf16 where that kernel is the fast one (AMX-BF16 tiles, or AVX-512
    /// BF16 on CPUs other than Intel's), else int16 on x86 CPUs with AVX2
    /// and FMA, else f32.
    #[default]
    Auto,
    /// f32 weights and activations ([`hearth_kernels::F32Matrix`] on CPUs
    /// with AVX2 and FMA but no AVX-512, else candle's GEMM).
    F32,
    /// Weights and activations rounded to bf16, sums in f32
    /// ([`hearth_kernels::Bf16Matrix`]); only on CPUs with AVX-512 BF16.
    Bf16,
    /// Weights rounded to 12-bit and activations to 13-bit integers with
    /// one scale per output column and per row, exact integer sums
    /// ([`hearth_kernels::I16Matrix`]); only on x86 CPUs with AVX2 and FMA.
    Int16,
}

impl EncoderPrecision {
    /// What `self` means on this CPU: [`EncoderPrecision::F32`],
    /// [`EncoderPrecision::Bf16`] or [`EncoderPrecision::Int16`]. `Auto`
    /// takes bf16 where that kernel is preferred
    /// ([`hearth_kernels::Bf16Matrix::is_preferred`]), else int16 where the
    /// CPU runs it (AVX2 and FMA; on AVX-512 CPUs too, where it was 1.9x
    /// the f32 GEMM), else f32.
    pub fn resolve(self) -> Result<Self> {
        let bf16 = hearth_kernels::Bf16Matrix::is_supported();
        match self {
            Self::Auto if hearth_kernels::Bf16Matrix::is_preferred() => Ok(Self::Bf16),
            Self::Auto if I16Matrix::is_supported() => Ok(Self::Int16),
            Self::Auto | Self::F32 => Ok(Self::F32),
            Self::Bf16 if bf16 => Ok(Self::Bf16),
            Self::Bf16 => candle_core::bail!(
                "bf16 encoder arithmetic needs a CPU with AVX-512 BF16; this one has none (use f32, int16 or auto)"
            ),
            Self::Int16 if I16Matrix::is_supported() => Ok(Self::Int16),
            Self::Int16 => candle_core::bail!(
                "int16 encoder arithmetic needs an x86 CPU with AVX2 and FMA; this one has none (use f32 or auto)"
            ),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int16 => "int16",
        }
    }
}

impl std::str::FromStr for EncoderPrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "int16" => Ok(Self::Int16),
            other => Err(format!(
                "`{other}` is not an encoder precision (auto, f32, bf16, int16)"
            )),
        }
    }
}

/// A dense layer's weights: f32 packed for the AVX2 + FMA kernel (CPUs
/// without AVX-512), f32 `[out, in]` row-major as stored (other CPUs:
/// candle's GEMM), or rounded to bf16 or to integers and packed for their
/// kernels.
enum Weights {
    Packed(hearth_kernels::F32Matrix),
    F32(Vec<f32>),
    Bf16(hearth_kernels::Bf16Matrix),
    I16(I16Matrix),
}

impl Weights {
    /// f32 weights `[out, in]` in the form this CPU runs fastest.
    fn f32(w: Vec<f32>, out: usize, inp: usize) -> Result<Self> {
        if !hearth_kernels::F32Matrix::is_preferred() {
            return Ok(Self::F32(w));
        }
        hearth_kernels::F32Matrix::new(&w, out, inp)
            .map(Self::Packed)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))
    }

    /// The weights as the kernel sees them, `[out, in]` in f32 (borrowed
    /// where they are kept in that form).
    fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Self::Packed(m) => m.weights().into(),
            Self::F32(w) => w.as_slice().into(),
            Self::Bf16(m) => m.weights_f32().into(),
            Self::I16(m) => m.weights().into(),
        }
    }
}

/// `[out, in]` weights and an `[out]` bias.
struct Dense {
    w: Weights,
    b: Vec<f32>,
    inp: usize,
    out: usize,
}

impl Dense {
    fn new(w: &Tensor, b: &Tensor) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        if b.dims1()? != out {
            candle_core::bail!("bias of {} for {out} outputs", b.dims1()?)
        }
        Ok(Self {
            w: Weights::f32(flat(w)?, out, inp)?,
            b: flat(b)?,
            inp,
            out,
        })
    }

    /// Switches the weights to `precision` (resolved: `F32`, `Bf16` or
    /// `Int16`); from a rounded form the weights stay rounded.
    fn set_precision(&mut self, precision: EncoderPrecision) -> Result<()> {
        let kernel = |e: hearth_kernels::Error| candle_core::Error::Msg(e.to_string());
        let (out, inp) = (self.out, self.inp);
        let w = match (&self.w, precision) {
            (Weights::Packed(_) | Weights::F32(_), EncoderPrecision::F32)
            | (Weights::Bf16(_), EncoderPrecision::Bf16)
            | (Weights::I16(_), EncoderPrecision::Int16)
            | (_, EncoderPrecision::Auto) => return Ok(()),
            (_, EncoderPrecision::F32) => Weights::f32(self.w.to_f32().into_owned(), out, inp)?,
            (_, EncoderPrecision::Bf16) => Weights::Bf16(
                hearth_kernels::Bf16Matrix::new(&self.w.to_f32(), out, inp).map_err(kernel)?,
            ),
            (_, EncoderPrecision::Int16) => {
                Weights::I16(I16Matrix::new(&self.w.to_f32(), out, inp).map_err(kernel)?)
            }
        };
        self.w = w;
        Ok(())
    }

    /// The matrix of a kernel that runs on tiled inputs, when the layer
    /// runs on one.
    fn packed(&self) -> Option<PackedMatrix<'_>> {
        match &self.w {
            Weights::Packed(m) => Some(PackedMatrix::F32(m)),
            Weights::I16(m) => Some(PackedMatrix::I16(m)),
            _ => None,
        }
    }

    /// `dst[rows, out] += x[rows, in] . W^T`.
    fn accumulate(&self, x: &[f32], dst: &mut [f32]) {
        let rows = x.len() / self.inp;
        assert_eq!(x.len(), rows * self.inp);
        assert_eq!(dst.len(), rows * self.out);
        if rows == 0 {
            return;
        }
        let w = match &self.w {
            Weights::F32(w) => w,
            Weights::Packed(m) => return m.matmul_acc(x, rows, dst),
            Weights::Bf16(m) => return m.matmul_acc(x, rows, dst),
            Weights::I16(m) => return m.matmul_acc(x, rows, dst),
        };
        let threads = rayon::current_num_threads();
        let parallelism = if threads > 1 {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: the three buffers hold exactly [rows, out], [rows, in] and
        // [out, in] (checked above and at construction); W^T is read as an
        // [in, out] matrix with column stride `in` and row stride 1.
        unsafe {
            gemm::gemm(
                rows,
                self.out,
                self.inp,
                dst.as_mut_ptr(),
                1,
                self.out as isize,
                true,
                x.as_ptr(),
                1,
                self.inp as isize,
                w.as_ptr(),
                self.inp as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    }

    /// `dst = x . W^T + b` (+ `residual` when given), `[rows, out]`; `dst`'s
    /// allocation is reused.
    fn forward_into(&self, x: &[f32], residual: Option<&[f32]>, dst: &mut Vec<f32>) {
        let out = self.out;
        let n = x.len() / self.inp * out;
        if let Some(r) = residual {
            assert_eq!(r.len(), n, "residual is not [rows, {out}]");
        }
        // One parallel pass writes `residual + b` (or `b`) into the buffer.
        dst.clear();
        dst.reserve(n);
        const ROWS: usize = 64;
        dst.spare_capacity_mut()[..n]
            .par_chunks_mut(out * ROWS)
            .enumerate()
            .for_each(|(i, chunk)| {
                let at = i * ROWS * out;
                let r = residual.map(|r| &r[at..at + chunk.len()]);
                vecmath::write_rows_plus(chunk, r, &self.b);
            });
        // SAFETY: the pass above wrote every one of the first `n` elements
        // (`n` is a multiple of `out`, and each chunk is whole rows).
        unsafe { dst.set_len(n) };
        self.accumulate(x, dst);
    }
}

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// LayerNorm with weight and bias over rows of `w.len()`, in place.
pub(crate) struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
    eps: f32,
}

impl Norm {
    pub(crate) fn new(w: &Tensor, b: &Tensor, eps: f64) -> Result<Self> {
        Ok(Self {
            w: flat(w)?,
            b: flat(b)?,
            eps: eps as f32,
        })
    }

    pub(crate) fn apply(&self, x: &mut [f32]) {
        let h = self.w.len();
        x.par_chunks_mut(h * 32)
            .for_each(|c| vecmath::layer_norm_rows(c, &self.w, &self.b, self.eps));
    }

    /// [`Norm::apply`], also writing the normalised rows regrouped into `t`
    /// for the next layer's f32 kernel (while they are in cache).
    fn apply_tiled(&self, x: &mut [f32], t: &mut TiledRows) {
        let h = self.w.len();
        t.reshape(x.len() / h, h);
        x.par_chunks_mut(h * TiledRows::TILE_ROWS)
            .zip(t.tiles_mut())
            .for_each(|(c, mut tile)| {
                vecmath::layer_norm_rows(c, &self.w, &self.b, self.eps);
                for (i, row) in c.chunks_exact(h).enumerate() {
                    tile.set_row(i, row);
                }
            });
    }
}

/// One encoder layer's weights as slices.
pub(crate) struct CpuLayer {
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    ffn_in: Dense,
    ffn_out: Dense,
    ffn_norm: Norm,
}

/// The tensors of one layer, as `bert.rs` loads them: (weight, bias) pairs,
/// Q/K/V stacked.
pub(crate) struct LayerTensors<'a> {
    pub qkv: &'a (Tensor, Tensor),
    pub attn_out: &'a (Tensor, Tensor),
    pub attn_norm: &'a (Tensor, Tensor),
    pub ffn_in: &'a (Tensor, Tensor),
    pub ffn_out: &'a (Tensor, Tensor),
    pub ffn_norm: &'a (Tensor, Tensor),
    pub eps: f64,
}

impl CpuLayer {
    pub(crate) fn new(t: LayerTensors) -> Result<Self> {
        Ok(Self {
            qkv: Dense::new(&t.qkv.0, &t.qkv.1)?,
            attn_out: Dense::new(&t.attn_out.0, &t.attn_out.1)?,
            attn_norm: Norm::new(&t.attn_norm.0, &t.attn_norm.1, t.eps)?,
            ffn_in: Dense::new(&t.ffn_in.0, &t.ffn_in.1)?,
            ffn_out: Dense::new(&t.ffn_out.0, &t.ffn_out.1)?,
            ffn_norm: Norm::new(&t.ffn_norm.0, &t.ffn_norm.1, t.eps)?,
        })
    }

    /// Switches the dense layers to `precision` (resolved).
    pub(crate) fn set_precision(&mut self, precision: EncoderPrecision) -> Result<()> {
        for d in [
            &mut self.qkv,
            &mut self.attn_out,
            &mut self.ffn_in,
            &mut self.ffn_out,
        ] {
            d.set_precision(precision)?;
        }
        Ok(())
    }

    /// `x`: packed `[total, hidden]`, replaced by the layer's output; `lens`:
    /// the sequences' lengths in order; `scratch` is reused from layer to
    /// layer (fresh multi-megabyte buffers cost page faults every time).
    pub(crate) fn forward(
        &self,
        x: &mut Vec<f32>,
        lens: &[usize],
        heads: usize,
        scratch: &mut Scratch,
    ) {
        let h = self.attn_out.out;
        if let Some(p) = self.packed().filter(|_| (h / heads).is_multiple_of(8)) {
            return self.forward_tiled(p, x, lens, heads, scratch);
        }
        scratch.x_tiled = false;
        let Scratch {
            qkv,
            ctx,
            y,
            f,
            residual,
            ..
        } = scratch;
        self.qkv.forward_into(x, None, qkv);
        packed_attention_into(qkv, h, heads, lens, ctx);
        // The input becomes the residual; its old buffer takes the output.
        std::mem::swap(x, residual);
        self.finish(ctx, residual, x, y, f);
    }

    /// The layer's four dense matrices, when all run on a kernel with
    /// tiled inputs.
    fn packed(&self) -> Option<[PackedMatrix<'_>; 4]> {
        Some([
            self.qkv.packed()?,
            self.attn_out.packed()?,
            self.ffn_in.packed()?,
            self.ffn_out.packed()?,
        ])
    }

    /// [`CpuLayer::forward`] on the packed f32 kernel: the biases and
    /// residuals are where the kernel's sums start, GELU is applied as the
    /// feed-forward sums are stored, and the inputs of the matrices stay
    /// regrouped by tiles from the step that writes them (attention, the
    /// LayerNorms, the first feed-forward matrix), so the layer has no
    /// passes of its own besides attention and the LayerNorms.
    fn forward_tiled(
        &self,
        [w_qkv, w_out, w_in, w_ffn]: [PackedMatrix<'_>; 4],
        x: &mut [f32],
        lens: &[usize],
        heads: usize,
        scratch: &mut Scratch,
    ) {
        let h = self.attn_out.out;
        let m = x.len() / h;
        let Scratch {
            qkv,
            y,
            xt,
            ctx_t,
            yt,
            ft,
            x_tiled,
            ..
        } = scratch;
        if !*x_tiled {
            xt.pack(x, h);
        }
        let none = Activation::None;
        qkv.resize(m * 3 * h, 0.0);
        let start = Start::Bias(&self.qkv.b);
        w_qkv.matmul(Input::Tiled(xt), m, start, none, Output::Rows(qkv));
        packed_attention_tiled(qkv, h, heads, lens, ctx_t);
        y.resize(m * h, 0.0);
        let start = Start::BiasResidual(&self.attn_out.b, x);
        w_out.matmul(Input::Tiled(ctx_t), m, start, none, Output::Rows(y));
        self.attn_norm.apply_tiled(y, yt);
        let (start, gelu) = (Start::Bias(&self.ffn_in.b), Activation::GeluErf);
        w_in.matmul(Input::Tiled(yt), m, start, gelu, Output::Tiled(ft));
        let start = Start::BiasResidual(&self.ffn_out.b, y);
        w_ffn.matmul(Input::Tiled(ft), m, start, none, Output::Rows(x));
        self.ffn_norm.apply_tiled(x, xt);
        *x_tiled = true;
    }

    /// [`CpuLayer::forward`] for one row per sequence (`picks[s]` within
    /// sequence `s`), over every row's keys and values: those rows' outputs,
    /// `[lens.len(), hidden]`.
    pub(crate) fn forward_rows(
        &self,
        x: &[f32],
        lens: &[usize],
        picks: &[usize],
        heads: usize,
        scratch: &mut Scratch,
    ) -> Vec<f32> {
        let h = self.attn_out.out;
        self.qkv.forward_into(x, None, &mut scratch.qkv);
        let ctx = packed_attention_rows(&scratch.qkv, h, heads, lens, picks);
        let residual = pick_rows(x, lens, picks, h);
        let mut out = Vec::new();
        self.finish(&ctx, &residual, &mut out, &mut scratch.y, &mut scratch.f);
        out
    }

    /// The layer after attention: output projection onto `residual`,
    /// LayerNorm, the feed-forward block and its LayerNorm, into `out`.
    fn finish(
        &self,
        ctx: &[f32],
        residual: &[f32],
        out: &mut Vec<f32>,
        y: &mut Vec<f32>,
        f: &mut Vec<f32>,
    ) {
        self.attn_out.forward_into(ctx, Some(residual), y);
        self.attn_norm.apply(y);
        self.ffn_in.forward_into(y, None, f);
        f.par_chunks_mut(8192).for_each(vecmath::gelu_erf_inplace);
        self.ffn_out.forward_into(f, Some(y), out);
        self.ffn_norm.apply(out);
    }
}

/// Row `picks[s]` of each sequence `s` of `x` (packed `[total, h]`, the
/// sequences `lens` long in order).
pub(crate) fn pick_rows(x: &[f32], lens: &[usize], picks: &[usize], h: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(lens.len() * h);
    let mut start = 0;
    for (&len, &pick) in lens.iter().zip(picks) {
        out.extend_from_slice(&x[(start + pick) * h..][..h]);
        start += len;
    }
    out
}

/// Buffers of a forward pass, shared by its layers.
#[derive(Default)]
pub(crate) struct Scratch {
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    y: Vec<f32>,
    f: Vec<f32>,
    residual: Vec<f32>,
    /// Regrouped by tiles ([`CpuLayer::forward_tiled`]): the layer's
    /// input (valid when `x_tiled`), the attention context, the
    /// LayerNorm's output and the feed-forward activations.
    xt: TiledRows,
    ctx_t: TiledRows,
    yt: TiledRows,
    ft: TiledRows,
    x_tiled: bool,
}

impl Scratch {
    /// Readies the buffers for a new forward pass (its input is not
    /// regrouped yet).
    pub(crate) fn begin(&mut self) {
        self.x_tiled = false;
    }

    /// Bytes held. (The destructuring names every field, so a new buffer
    /// does not compile until it is counted here.)
    pub(crate) fn bytes(&self) -> usize {
        let Scratch {
            qkv,
            ctx,
            y,
            f,
            residual,
            xt,
            ctx_t,
            yt,
            ft,
            x_tiled: _,
        } = self;
        let floats = [qkv, ctx, y, f, residual]
            .iter()
            .map(|v| v.capacity())
            .sum::<usize>()
            + [xt, ctx_t, yt, ft]
                .iter()
                .map(|t| t.capacity())
                .sum::<usize>();
        floats * size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::EncoderPrecision;

    #[test]
    fn precision_names_parse_and_print() {
        for p in [
            EncoderPrecision::Auto,
            EncoderPrecision::F32,
            EncoderPrecision::Bf16,
            EncoderPrecision::Int16,
        ] {
            assert_eq!(p.as_str().parse::<EncoderPrecision>(), Ok(p));
        }
        let err = "fp16".parse::<EncoderPrecision>().unwrap_err();
        assert!(err.contains("auto, f32, bf16, int16"), "{err}");
        // Auto always resolves; F32 always to itself.
        assert_ne!(
            EncoderPrecision::Auto.resolve().unwrap(),
            EncoderPrecision::Auto
        );
        assert_eq!(
            EncoderPrecision::F32.resolve().unwrap(),
            EncoderPrecision::F32
        );
    }
}
