//! A layer's small steps as single ops over the tensor path (the GPU's):
//! the residual sum and the RMS norm after it ([`add_rms_norm`]), SwiGLU's
//! `silu(gate) * up` ([`swiglu`]), RoPE of the query rows ([`rotate`]) and
//! the new keys (rotated) and values written into the paged pool in its
//! dtype ([`write_rows`]). candle's operations take two to five launches
//! (and as many allocations) for each; a decode step on a GPU is bound by
//! their count, not by their arithmetic.
//!
//! Activations are f32 `[rows, cols]`, read in place through their row
//! stride: column slices of a wider output (narrow views) need no copy.
//! On CUDA the kernels are `layer_ops.cu`'s (PTX from the crate's build
//! script); on the CPU the same arithmetic runs in plain loops, so the ops
//! are tested on every machine (the tensor-pool model against the CPU
//! path) and the kernels against them on a GPU. Metal keeps candle's
//! operations ([`supported`]).

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, Device, InplaceOp2, Layout, Result, Shape, Tensor, WithDType,
};

use crate::rotary::RopeLayout;

/// Whether the ops run on `device`: the CPU and CUDA.
pub(crate) fn supported(device: &Device) -> bool {
    device.is_cpu() || device.is_cuda()
}

/// A 2-D f32 input as read in place: first element, row stride, shape.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rows {
    start: usize,
    stride: usize,
    rows: usize,
    cols: usize,
}

impl Rows {
    fn of(l: &Layout, what: &str) -> Result<Self> {
        let (rows, cols) = match l.dims() {
            [r, c] => (*r, *c),
            d => candle_core::bail!("{what}: want [rows, cols], got {d:?}"),
        };
        let stride = l.stride();
        if cols > 1 && stride[1] != 1 || rows > 1 && stride[0] < cols {
            candle_core::bail!("{what}: rows of {cols} with strides {stride:?}")
        }
        let row_stride = if rows > 1 { stride[0] } else { cols };
        Ok(Self {
            start: l.start_offset(),
            stride: row_stride,
            rows,
            cols,
        })
    }

    /// Row `r` of `data`.
    fn row<'a>(&self, data: &'a [f32], r: usize) -> &'a [f32] {
        &data[self.start + r * self.stride..][..self.cols]
    }
}

fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// `(x + h, rms_norm(x + h) * weight)`, `x` and `h` f32 `[rows, cols]`;
/// with `round`, the norm's runs of 32 rounded as [`round_q8`] rounds them
/// (in the same kernel, for the quantized matmul it feeds; `cols` then a
/// multiple of 32).
pub(crate) fn add_rms_norm(
    x: &Tensor,
    h: &Tensor,
    weight: &Tensor,
    eps: f32,
    round: bool,
) -> Result<(Tensor, Tensor)> {
    let both = x.apply_op2_no_bwd(h, &AddRmsNorm { weight, eps, round })?;
    Ok((both.get(0)?, both.get(1)?))
}

/// `silu(gate) * up`, both f32 `[rows, cols]`; the result contiguous;
/// with `round`, rounded as [`round_q8`] rounds (as [`add_rms_norm`]).
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor, round: bool) -> Result<Tensor> {
    gate.apply_op2_no_bwd(up, &SwiGlu { round })
}

/// Each run of 32 values of `values` rounded to 8 bits in place (the CPU's
/// [`round_q8`]).
pub(crate) fn round_runs(values: &mut [f32]) {
    for run in values.chunks_mut(32) {
        let amax = run.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        for v in run {
            *v = if amax == 0.0 {
                0.0
            } else {
                d * (*v / d).round()
            };
        }
    }
}

/// Refuses `round` on rows that are not whole runs of 32.
fn check_round(round: bool, cols: usize, what: &str) -> Result<()> {
    if round && !cols.is_multiple_of(32) {
        candle_core::bail!("{what}: rounding rows of {cols}, want a multiple of 32")
    }
    Ok(())
}

/// Each run of 32 values of `x` (f32, rows a multiple of 32 long) rounded
/// to 8 bits as Q8_1 quantizes activations (`d = max|x| / 127`, `x = d *
/// round(x / d)`), so that a quantized matmul that quantizes them again
/// finds exactly these values. candle's CUDA matmuls take a block
/// minimum's term from the raw activations' sum and the rest from the
/// rounded ones, which leaves formats with a minimum (Q4_1, Q5_1, Q2_K,
/// Q4_K, Q5_K) 2-3 times further from the exact product than the rounding
/// alone puts them; on rounded activations both terms agree.
pub fn round_q8(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&RoundQ8)
}

struct RoundQ8;

impl RoundQ8 {
    fn runs(l: &Layout) -> Result<usize> {
        let n = l.shape().elem_count();
        match l.dims().last() {
            Some(&k) if k.is_multiple_of(32) && l.is_contiguous() => Ok(n / 32),
            _ => candle_core::bail!("round-q8: rows of {:?}, want a multiple of 32", l.dims()),
        }
    }
}

impl CustomOp1 for RoundQ8 {
    fn name(&self) -> &'static str {
        "round-q8"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let runs = Self::runs(l)?;
        let mut out = s.as_slice::<f32>()?[l.start_offset()..][..runs * 32].to_vec();
        round_runs(&mut out);
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let runs = Self::runs(l)?;
        Ok((
            cuda::round_q8((s, l.start_offset()), runs)?,
            l.shape().clone(),
        ))
    }
}

/// A step's RoPE rows and their layout: `cos` and `sin` f32 with
/// `tokens * head_dim / 2` values each, row `t` for token `t`.
#[derive(Clone, Copy)]
pub(crate) struct Rope<'a> {
    pub(crate) cos: &'a Tensor,
    pub(crate) sin: &'a Tensor,
    pub(crate) layout: RopeLayout,
}

/// `x` (`[tokens, heads * head_dim]` f32) rotated: `[tokens, heads,
/// head_dim]`, contiguous.
pub(crate) fn rotate(x: &Tensor, rope: Rope<'_>, heads: usize) -> Result<Tensor> {
    x.apply_op1_no_bwd(&Rotate {
        rope: Some(rope),
        heads,
        rows: None,
    })
}

/// Writes `x` (`[tokens, width]` f32, rotated first with `rope`) into rows
/// `rows` (`[tokens]` u32) of `dst` (`[pool rows, width]` in its dtype).
pub(crate) fn write_rows(
    dst: &Tensor,
    x: &Tensor,
    rows: &Tensor,
    rope: Option<Rope<'_>>,
    heads: usize,
) -> Result<()> {
    dst.inplace_op2(
        x,
        &Rotate {
            rope,
            heads,
            rows: Some(rows),
        },
    )
}

struct AddRmsNorm<'a> {
    weight: &'a Tensor,
    eps: f32,
    round: bool,
}

impl AddRmsNorm<'_> {
    fn shapes(&self, l1: &Layout, l2: &Layout) -> Result<(Rows, Rows)> {
        let (x, h) = (
            Rows::of(l1, "add-rms-norm x")?,
            Rows::of(l2, "add-rms-norm h")?,
        );
        let n = self.weight.elem_count();
        if (x.rows, x.cols) != (h.rows, h.cols) || x.cols != n {
            candle_core::bail!("add-rms-norm: x {x:?}, h {h:?}, weight of {n}")
        }
        check_round(self.round, x.cols, "add-rms-norm")?;
        Ok((x, h))
    }
}

impl CustomOp2 for AddRmsNorm<'_> {
    fn name(&self) -> &'static str {
        "add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, h) = self.shapes(l1, l2)?;
        let (xs, hs) = (s1.as_slice::<f32>()?, s2.as_slice::<f32>()?);
        let w = f32s(self.weight)?;
        let (rows, cols) = (x.rows, x.cols);
        let mut out = vec![0f32; 2 * rows * cols];
        let (sums, norms) = out.split_at_mut(rows * cols);
        for r in 0..rows {
            let sum = &mut sums[r * cols..][..cols];
            for ((s, a), b) in sum.iter_mut().zip(x.row(xs, r)).zip(h.row(hs, r)) {
                *s = a + b;
            }
            let squares: f32 = sum.iter().map(|v| v * v).sum();
            let scale = 1.0 / (squares / cols as f32 + self.eps).sqrt();
            let norm = &mut norms[r * cols..][..cols];
            for ((n, s), w) in norm.iter_mut().zip(&*sum).zip(&w) {
                *n = s * scale * w;
            }
            if self.round {
                round_runs(norm);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((2, rows, cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (x, h) = self.shapes(l1, l2)?;
        let out = cuda::add_rms_norm(self, (s1, x), (s2, h))?;
        Ok((out, Shape::from((2, x.rows, x.cols))))
    }
}

struct SwiGlu {
    round: bool,
}

impl SwiGlu {
    fn shapes(&self, l1: &Layout, l2: &Layout) -> Result<(Rows, Rows)> {
        let (g, u) = (Rows::of(l1, "swiglu gate")?, Rows::of(l2, "swiglu up")?);
        if (g.rows, g.cols) != (u.rows, u.cols) {
            candle_core::bail!("swiglu: gate {g:?}, up {u:?}")
        }
        check_round(self.round, g.cols, "swiglu")?;
        Ok((g, u))
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = self.shapes(l1, l2)?;
        let (gs, us) = (s1.as_slice::<f32>()?, s2.as_slice::<f32>()?);
        let mut out = Vec::with_capacity(g.rows * g.cols);
        for r in 0..g.rows {
            out.extend(
                g.row(gs, r)
                    .iter()
                    .zip(u.row(us, r))
                    .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b),
            );
        }
        if self.round {
            round_runs(&mut out);
        }
        Ok((CpuStorage::F32(out), Shape::from((g.rows, g.cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (g, u) = self.shapes(l1, l2)?;
        let out = cuda::swiglu(self, (s1, g), (s2, u))?;
        Ok((out, Shape::from((g.rows, g.cols))))
    }
}

/// RoPE (or a plain copy) of `heads` heads per row, into a new tensor or,
/// in place, into rows `rows` of the pool.
struct Rotate<'a> {
    rope: Option<Rope<'a>>,
    heads: usize,
    rows: Option<&'a Tensor>,
}

impl Rotate<'_> {
    fn head_dim(&self, x: &Rows) -> Result<usize> {
        let d = x.cols / self.heads.max(1);
        if d * self.heads != x.cols || !d.is_multiple_of(2) {
            candle_core::bail!("rotate: {} columns for {} heads", x.cols, self.heads)
        }
        if let Some(rope) = &self.rope {
            let want = x.rows * d / 2;
            if rope.cos.elem_count() != want || rope.sin.elem_count() != want {
                candle_core::bail!("rotate: rope rows for {} tokens, head_dim {d}", x.rows)
            }
        }
        if let Some(rows) = self.rows {
            if rows.elem_count() != x.rows {
                candle_core::bail!(
                    "rotate: {} pool rows for {} tokens",
                    rows.elem_count(),
                    x.rows
                )
            }
        }
        Ok(d)
    }

    /// 0: copy; 1: pairs `(2i, 2i + 1)`; 2: halves `(i, i + d / 2)`.
    fn mode(&self) -> i32 {
        match self.rope.map(|r| r.layout) {
            None => 0,
            Some(RopeLayout::Interleaved) => 1,
            Some(RopeLayout::Halves) => 2,
        }
    }

    /// The CPU version: row `t` of `x` to row `dst_rows[t]` (or `t`) of
    /// `dst`, `dst_width` wide.
    fn cpu<T: WithDType>(
        &self,
        x: Rows,
        xs: &[f32],
        dst: &mut [T],
        dst_rows: Option<&[u32]>,
        dst_width: usize,
    ) -> Result<()> {
        let d = self.head_dim(&x)?;
        let half = d / 2;
        let tables = match &self.rope {
            Some(r) => Some((f32s(r.cos)?, f32s(r.sin)?)),
            None => None,
        };
        let mode = self.mode();
        for t in 0..x.rows {
            let src = x.row(xs, t);
            let row = dst_rows.map_or(t, |r| r[t] as usize);
            let out = &mut dst[row * dst_width..][..x.cols];
            for h in 0..self.heads {
                let (src, out) = (&src[h * d..][..d], &mut out[h * d..][..d]);
                for p in 0..half {
                    let (a, b) = if mode == 1 {
                        (2 * p, 2 * p + 1)
                    } else {
                        (p, p + half)
                    };
                    let (va, vb) = match &tables {
                        Some((cos, sin)) => {
                            let (c, s) = (cos[t * half + p], sin[t * half + p]);
                            (src[a] * c - src[b] * s, src[a] * s + src[b] * c)
                        }
                        None => (src[a], src[b]),
                    };
                    out[a] = T::from_f64(va as f64);
                    out[b] = T::from_f64(vb as f64);
                }
            }
        }
        Ok(())
    }
}

impl CustomOp1 for Rotate<'_> {
    fn name(&self) -> &'static str {
        "rotate"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = Rows::of(l, "rotate")?;
        let d = self.head_dim(&x)?;
        let mut out = vec![0f32; x.rows * x.cols];
        self.cpu(x, s.as_slice::<f32>()?, &mut out, None, x.cols)?;
        Ok((CpuStorage::F32(out), Shape::from((x.rows, self.heads, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let x = Rows::of(l, "rotate")?;
        let d = self.head_dim(&x)?;
        let out = cuda::rotate_new(self, (s, x), d)?;
        Ok((out, Shape::from((x.rows, self.heads, d))))
    }
}

impl InplaceOp2 for Rotate<'_> {
    fn name(&self) -> &'static str {
        "write-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let x = Rows::of(l2, "write-rows")?;
        let width = pool_width(l1, &x)?;
        let rows: Vec<u32> = match self.rows {
            Some(r) => r.flatten_all()?.to_vec1()?,
            None => candle_core::bail!("write-rows: no pool rows"),
        };
        if let Some(&bad) = rows
            .iter()
            .find(|&&r| (r as usize + 1) * width > l1.shape().elem_count())
        {
            candle_core::bail!("write-rows: pool row {bad} out of range")
        }
        let xs = s2.as_slice::<f32>()?;
        let start = l1.start_offset();
        match s1 {
            CpuStorage::F32(d) => self.cpu(x, xs, &mut d[start..], Some(&rows), width),
            CpuStorage::F16(d) => self.cpu(x, xs, &mut d[start..], Some(&rows), width),
            CpuStorage::BF16(d) => self.cpu(x, xs, &mut d[start..], Some(&rows), width),
            other => candle_core::bail!("write-rows: pool of {:?}", other.dtype()),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let x = Rows::of(l2, "write-rows")?;
        let width = pool_width(l1, &x)?;
        let d = self.head_dim(&x)?;
        use candle_core::DType;
        match s1.dtype() {
            DType::F32 => cuda::write::<f32>(self, "f32", (s1, l1), (s2, x), width, d),
            DType::F16 => cuda::write::<half::f16>(self, "f16", (s1, l1), (s2, x), width, d),
            DType::BF16 => cuda::write::<half::bf16>(self, "bf16", (s1, l1), (s2, x), width, d),
            other => candle_core::bail!("write-rows: pool of {other:?}"),
        }
    }
}

/// The pool's row width: it must be contiguous and as wide as `x`.
fn pool_width(l: &Layout, x: &Rows) -> Result<usize> {
    match l.dims() {
        [_, w] if *w == x.cols && l.is_contiguous() => Ok(*w),
        d => candle_core::bail!("write-rows: pool {d:?} for rows of {}", x.cols),
    }
}

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod tests;
