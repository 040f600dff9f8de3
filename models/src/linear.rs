//! A linear layer `y = x W^T (+ b)` over either a quantized GGUF weight or a
//! plain float weight.
//!
//! - Quantized on the CPU in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K: a
//!   `hearth-kernels` [`QuantMatrix`] applied by a candle custom op, the
//!   activations quantized to 8 bits per 32 values (candle runs Q4_1/Q5_x
//!   through scalar loops, its Q4_0/Q8_0 kernels are 3-10x slower than
//!   these, and its K-quant kernels take one activation row at a time; see
//!   `examples/qmatmul_speed.rs`). With every layer on these kernels a Llama
//!   runs the slice forward of `llama_cpu.rs`.
//! - Quantized otherwise (other formats, other devices): a candle [`QMatMul`]
//!   over the [`QTensor`]. candle dequantizes F32/F16/BF16 `QTensor`s into a
//!   plain tensor on its own, so any GGUF matrix can go through
//!   [`Linear::from_qtensor`].
//! - Dense: a `[out, in]` tensor in f32, f16 or bf16. The input is cast to the
//!   weight's dtype for the matmul and the result cast back, so callers always
//!   work in their own activation dtype (f32 in this crate).

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Module, Result, Shape, Tensor, D};
use hearth_kernels::{Format, QuantMatrix};

/// Weight of a [`Linear`].
#[derive(Debug, Clone)]
pub(crate) enum Weight {
    Quantized(QMatMul),
    Kernel(KernelOp),
    Dense(Tensor),
    /// Output rows `start..start + out_features` of a wider linear that
    /// holds several projections' weights as one (`linear_fused.rs`).
    Part {
        whole: Arc<Linear>,
        start: usize,
    },
}

/// The `hearth-kernels` format of a GGML dtype, if it has one.
pub fn kernel_format(dtype: GgmlDType) -> Option<Format> {
    Some(match dtype {
        GgmlDType::Q4_0 => Format::Q4_0,
        GgmlDType::Q4_1 => Format::Q4_1,
        GgmlDType::Q5_0 => Format::Q5_0,
        GgmlDType::Q5_1 => Format::Q5_1,
        GgmlDType::Q8_0 => Format::Q8_0,
        GgmlDType::Q2K => Format::Q2K,
        GgmlDType::Q3K => Format::Q3K,
        GgmlDType::Q4K => Format::Q4K,
        GgmlDType::Q5K => Format::Q5K,
        GgmlDType::Q6K => Format::Q6K,
        _ => return None,
    })
}

/// Whether `q`'s matmul gets its activations rounded to 8 bits first
/// ([`crate::layer_ops::round_q8`]): on CUDA, for the formats with a block
/// minimum, unless `HEARTH_CUDA_ROUND_ACTIVATIONS=0`. candle's CUDA
/// matmuls on those formats are 1.7-3x as far from the exact product as
/// the activations' rounding accounts for, and the default model's
/// teacher-forced log-probabilities miss llama.cpp's reference; on rounded
/// activations every format is at the rounding's error (0.97-1.02x on an
/// H200) and the reference is met (worst 0.31 against 0.75). Where one of
/// Hearth's kernels produced the input it rounded it there
/// ([`mark_rounded`]: the norms, SwiGLU, the attention's decode kernel);
/// otherwise this is one more launch. On an H200, the default model at 1
/// and 64 streams within the runs' noise of without (0.95-1.05x at 64;
/// `benches/README.md`, `benches/HISTORY.md`); `=0` gives candle's products as they are.
fn rounds_activations(q: &QTensor, k: usize) -> bool {
    let with_min = matches!(
        q.dtype(),
        GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q2K | GgmlDType::Q4K | GgmlDType::Q5K
    );
    cuda_rounds_activations() && with_min && k.is_multiple_of(32) && q.device().is_cuda()
}

/// Whether the rounding of [`rounds_activations`] is on:
/// `HEARTH_CUDA_ROUND_ACTIVATIONS` unset or anything but `0`.
pub fn cuda_rounds_activations() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("HEARTH_CUDA_ROUND_ACTIVATIONS").map_or(true, |v| v.trim() != "0")
    })
}

thread_local! {
    /// Ids of the latest tensors a layer op rounded as [`rounds_activations`]
    /// asks (a forward pass runs on one thread; ids are never reused).
    static ROUNDED: std::cell::Cell<[Option<candle_core::TensorId>; 4]> =
        const { std::cell::Cell::new([None; 4]) };
}

/// Records that `t` holds activations already rounded to 8 bits per run of
/// 32 ([`crate::layer_ops::round_q8`]'s values), so that the linears it
/// feeds on this thread skip their own rounding launch.
pub(crate) fn mark_rounded(t: &Tensor) {
    ROUNDED.with(|ids| {
        let mut v = ids.get();
        v.rotate_right(1);
        v[0] = Some(t.id());
        ids.set(v);
    });
}

fn is_rounded(t: &Tensor) -> bool {
    ROUNDED.with(|ids| ids.get().contains(&Some(t.id())))
}

/// `x W^T` through a [`QuantMatrix`], as a candle op on the CPU: `x` is f32
/// `[..., k]`, the result `[..., n]`.
#[derive(Debug, Clone)]
pub(crate) struct KernelOp(pub(crate) Arc<QuantMatrix>);

impl CustomOp1 for KernelOp {
    fn name(&self) -> &'static str {
        "hearth-kernels-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let w = &self.0;
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("quantized matmul expects f32 input")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("quantized matmul expects a contiguous input")
        };
        let mut dims = layout.dims().to_vec();
        match dims.last_mut() {
            Some(last) if *last == w.k() => *last = w.n(),
            _ => candle_core::bail!("quantized matmul: input {dims:?} does not end in {}", w.k()),
        }
        let x = &data[start..end];
        let m = x.len() / w.k();
        let mut out = vec![0f32; m * w.n()];
        w.matmul(x, m, &mut out);
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

/// `y = x W^T + b` with `W` of shape `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub(crate) weight: Weight,
    pub(crate) bias: Option<Tensor>,
    pub(crate) in_features: usize,
    pub(crate) out_features: usize,
}

impl Linear {
    /// Wraps a GGUF tensor of shape `[out, in]` (candle's order).
    pub fn from_qtensor(qtensor: QTensor) -> Result<Self> {
        Self::from_arc(Arc::new(qtensor))
    }

    /// Like [`Linear::from_qtensor`], sharing the tensor.
    pub fn from_arc(qtensor: Arc<QTensor>) -> Result<Self> {
        let (out_features, in_features) = qtensor.shape().dims2()?;
        match kernel_format(qtensor.dtype()) {
            Some(format) if qtensor.device().is_cpu() => Self::with_kernel(&qtensor, format),
            _ => Ok(Self {
                weight: Weight::Quantized(QMatMul::from_arc(qtensor)?),
                bias: None,
                in_features,
                out_features,
            }),
        }
    }

    /// The tensor's blocks as a `hearth-kernels` matrix of `format`.
    fn with_kernel(qtensor: &QTensor, format: Format) -> Result<Self> {
        let (n, k) = qtensor.shape().dims2()?;
        let data = qtensor.data()?;
        let m = QuantMatrix::new(format, &data, n, k)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(Self::from_kernel(m))
    }

    /// Wraps a `hearth-kernels` matrix (CPU only).
    pub(crate) fn from_kernel(m: QuantMatrix) -> Self {
        Self {
            in_features: m.k(),
            out_features: m.n(),
            weight: Weight::Kernel(KernelOp(Arc::new(m))),
            bias: None,
        }
    }

    /// Wraps a float weight of shape `[out, in]`.
    pub fn dense(weight: Tensor) -> Result<Self> {
        let (out_features, in_features) = weight.dims2()?;
        Ok(Self {
            weight: Weight::Dense(weight),
            bias: None,
            in_features,
            out_features,
        })
    }

    /// Adds a bias of shape `[out]` (kept in f32).
    pub fn with_bias(mut self, bias: Tensor) -> Result<Self> {
        let n = bias.dims1()?;
        if n != self.out_features {
            candle_core::bail!(
                "bias of {n} for a linear with {} outputs",
                self.out_features
            )
        }
        self.bias = Some(bias.to_dtype(DType::F32)?);
        Ok(self)
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Whether this linear rounds its input's runs of 32 to 8 bits before
    /// its matmul ([`rounds_activations`]): a layer op that produces that
    /// input may round it in its own kernel instead
    /// ([`crate::layer_ops::add_rms_norm`], [`crate::layer_ops::swiglu`])
    /// and say so with [`mark_rounded`].
    pub(crate) fn rounds_input(&self) -> bool {
        match &self.weight {
            Weight::Quantized(QMatMul::QTensor(q)) => rounds_activations(q, self.in_features),
            Weight::Part { whole, .. } => whole.rounds_input(),
            _ => false,
        }
    }

    /// The `hearth-kernels` matrix of a kernel linear without bias.
    pub(crate) fn kernel(&self) -> Option<&Arc<QuantMatrix>> {
        match (&self.weight, &self.bias) {
            (Weight::Kernel(op), None) => Some(&op.0),
            _ => None,
        }
    }

    /// True when the weight stays quantized (matmul through `QMatMul`).
    pub fn is_quantized(&self) -> bool {
        match &self.weight {
            Weight::Part { whole, .. } => whole.is_quantized(),
            w => matches!(
                w,
                Weight::Quantized(QMatMul::QTensor(_)) | Weight::Kernel(_)
            ),
        }
    }
}

impl Module for Linear {
    /// `x`: `[..., in_features]` in any float dtype; result in the same dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_dtype = x.dtype();
        let dims = x.dims().to_vec();
        let k = x.dim(D::Minus1)?;
        if k != self.in_features {
            candle_core::bail!("linear expects {} inputs, got {k}", self.in_features)
        }
        if let Weight::Part { whole, start } = &self.weight {
            // The whole product, then this part's columns (the fused path
            // runs the whole once for all its parts instead).
            return whole
                .forward(x)?
                .narrow(D::Minus1, *start, self.out_features);
        }
        let rows = x.elem_count() / k.max(1);
        // Asked only where rounding applies (never on the CPU's path).
        let already_rounded = || is_rounded(x);
        let x2 = x.reshape((rows, k))?;
        let y = match &self.weight {
            Weight::Quantized(w) => {
                let x = x2.to_dtype(DType::F32)?.contiguous()?;
                match w {
                    QMatMul::QTensor(q) if rounds_activations(q, k) && !already_rounded() => {
                        w.forward(&crate::layer_ops::round_q8(&x)?)?
                    }
                    _ => w.forward(&x)?,
                }
            }
            Weight::Kernel(op) => x2
                .to_dtype(DType::F32)?
                .contiguous()?
                .apply_op1_no_bwd(op)?,
            Weight::Dense(w) => x2.to_dtype(w.dtype())?.matmul(&w.t()?)?,
            Weight::Part { .. } => unreachable!("returned above"),
        };
        let y = match &self.bias {
            Some(b) => y.to_dtype(DType::F32)?.broadcast_add(b)?,
            None => y,
        };
        let mut out_dims = dims;
        *out_dims.last_mut().expect("rank >= 1") = self.out_features;
        y.to_dtype(in_dtype)?.reshape(out_dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::Device;

    /// The quantized matmul uses the dequantized weights exactly but rounds
    /// the activations to Q8_0 too: per block of 32, `d = max|x| / 127`
    /// (stored as f16) and each `x` becomes `round(x / d) * d`, off by at most
    /// `d / 2 + 127 * |d - f16(d)| < 0.57 d`. So every output is within
    /// `sum_j |w_j| * 0.57 * d(block of j)` (+1e-3 for f32 summation order) of
    /// the f32 matmul with dequantized weights. That is the stated tolerance
    /// (about 0.3 absolute here, where outputs are around 16 in size); the
    /// relative RMS error must also stay under 1%.
    #[test]
    fn q8_0_linear_matches_dequantized_matmul() -> Result<()> {
        let dev = Device::Cpu;
        let (out_f, in_f, rows) = (96, 256, 5);
        let w = Tensor::randn(0f32, 1.0, (out_f, in_f), &dev)?;
        let x = Tensor::randn(0f32, 1.0, (rows, in_f), &dev)?;
        let q = QTensor::quantize(&w, GgmlDType::Q8_0)?;
        let deq = q.dequantize(&dev)?;
        let lin = Linear::from_qtensor(q)?;
        assert!(lin.is_quantized());
        assert_eq!((lin.out_features(), lin.in_features()), (out_f, in_f));

        let got = lin.forward(&x)?;
        let want = x.matmul(&deq.t()?)?;
        assert_eq!(got.dims(), &[rows, out_f]);

        let (xs, ws) = (x.to_vec2::<f32>()?, deq.to_vec2::<f32>()?);
        let (gs, wants) = (got.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
        for r in 0..rows {
            let d: Vec<f32> = xs[r]
                .chunks(32)
                .map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
                .collect();
            for o in 0..out_f {
                let bound: f32 = (0..in_f)
                    .map(|j| ws[o][j].abs() * 0.57 * d[j / 32])
                    .sum::<f32>()
                    + 1e-3;
                let diff = (gs[r][o] - wants[r][o]).abs();
                assert!(
                    diff <= bound,
                    "row {r} out {o}: |diff| {diff} > bound {bound}"
                );
            }
        }
        let rel_rms = ((&got - &want)?.sqr()?.mean_all()?.to_scalar::<f32>()?
            / want.sqr()?.mean_all()?.to_scalar::<f32>()?)
        .sqrt();
        assert!(rel_rms < 1e-2, "relative rms {rel_rms}");

        // A 3-D input goes through the same path.
        let got3 = lin.forward(&x.unsqueeze(0)?)?;
        assert_eq!(got3.dims(), &[1, rows, out_f]);
        let d = (got3.squeeze(0)? - &got)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(d < 1e-6, "3-D input differs by {d}");
        Ok(())
    }

    /// Every `hearth-kernels` format, quantized by candle: the kernel's
    /// unpacking reproduces candle's dequantization exactly (so the block
    /// layouts agree), and the outputs are within the activation-rounding
    /// bound of `hearth-kernels`' `act.rs` of f32 math on those weights:
    /// `sum_j 0.5625 |w_j| d(j) + sum_b |m_b| 2^-10 (sum_b |x| + 16 d_b)`
    /// (`d = max|x| / 127` per 32 values, or per 256 for Q2_K and Q3_K and
    /// as `Format::activation_span` says for the other K-quants), plus 1e-5
    /// relative for summation order. The block offsets `m_b` are not
    /// visible here; candle's quantizers keep them within `1.5 max_b |w|`,
    /// which the bound uses.
    #[test]
    fn kernel_formats_match_candle_dequantization() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (40, 512);
        // 3 rows: a decode step's kernels; 6: a prompt step's.
        for (rows, dtype) in [3, 6].into_iter().flat_map(|r| {
            [
                GgmlDType::Q4_0,
                GgmlDType::Q4_1,
                GgmlDType::Q5_0,
                GgmlDType::Q5_1,
                GgmlDType::Q8_0,
                GgmlDType::Q2K,
                GgmlDType::Q3K,
                GgmlDType::Q4K,
                GgmlDType::Q5K,
                GgmlDType::Q6K,
            ]
            .map(|d| (r, d))
        }) {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev)?;
            let q = QTensor::quantize(&w, dtype)?;
            let deq = q.dequantize(&dev)?;
            let format = kernel_format(dtype).expect("a kernel format");
            let lin = Linear::with_kernel(&q, format)?;
            let Weight::Kernel(op) = &lin.weight else {
                panic!("{dtype:?} did not take the kernel path")
            };
            let default = Linear::from_qtensor(q)?;
            assert!(
                matches!(default.weight, Weight::Kernel(_)),
                "{dtype:?}: default path"
            );
            let ws = deq.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(op.0.dequantize(), ws, "{dtype:?}: unpacking differs");

            let got = lin.forward(&x)?.to_vec2::<f32>()?;
            let xs = x.to_vec2::<f32>()?;
            for (r, xr) in xs.iter().enumerate() {
                for o in 0..n {
                    let wr = &ws[o * k..(o + 1) * k];
                    let (mut want, mut bound) = (0f64, 0f64);
                    let span = format.activation_span(rows);
                    for (b, (wb, xb)) in wr.chunks(32).zip(xr.chunks(32)).enumerate() {
                        let xs = &xr[b * 32 / span * span..][..span];
                        let d = xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                        let m = 1.5 * wb.iter().fold(0f32, |a, v| a.max(v.abs()));
                        let sx: f32 = xb.iter().map(|v| v.abs()).sum();
                        bound += (m * (sx + 16.0 * d) / 1024.0) as f64;
                        for (w, x) in wb.iter().zip(xb) {
                            want += (w * x) as f64;
                            bound += (w.abs() * (0.5625 * d + 1e-5 * x.abs())) as f64;
                        }
                    }
                    let diff = (got[r][o] as f64 - want).abs();
                    assert!(
                        diff <= bound * 1.001 + 1e-5,
                        "{dtype:?} row {r} out {o}: |diff| {diff} > {bound}"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn dense_linear_with_bias_and_half_weights() -> Result<()> {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (7, 16), &dev)?;
        let b = Tensor::randn(0f32, 1.0, 7, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (3, 16), &dev)?;
        let want = x.matmul(&w.t()?)?.broadcast_add(&b)?;

        let lin = Linear::dense(w.clone())?.with_bias(b.clone())?;
        assert!(!lin.is_quantized());
        let d = (lin.forward(&x)? - &want)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(d < 1e-5, "f32 dense differs by {d}");

        let lin16 = Linear::dense(w.to_dtype(DType::F16)?)?.with_bias(b)?;
        let got = lin16.forward(&x)?;
        assert_eq!(got.dtype(), DType::F32);
        let d = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(d < 0.05, "f16 dense differs by {d}");
        assert!(Linear::dense(w)?
            .forward(&Tensor::zeros((2, 5), DType::F32, &dev)?)
            .is_err());
        Ok(())
    }
}
