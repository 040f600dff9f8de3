//! Paged attention of decoding rows as one fused op over the tensor pool
//! ([`super::TensorKv`]): every sequence's single new query row against its
//! keys and values, read in place through its block table. The queries
//! are read in place too, from the step's `[tokens, num_heads, head_dim]`
//! rows, and rounded to the pool's dtype as they are loaded; the block
//! tables go to the device once per step ([`PagedDecode::new`]), not once
//! per layer.
//!
//! On CUDA this is the kernel in `paged_decode.cu` (compiled to PTX by the
//! crate's build script): one thread block per query head and sequence,
//! an online softmax over the sequence's positions, no gathered copy of the
//! context and no padding to the longest sequence. On the CPU the op runs
//! the same arithmetic in plain loops, so its bookkeeping (block tables,
//! grouped-query heads, offsets) is tested on every machine; the CUDA
//! kernel is tested against the CPU paged op on a GPU
//! (`tensors::tests`, with the `cuda` feature).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, WithDType};

use super::{SeqView, BLOCK_SIZE};

/// Head sizes the CUDA kernel is built for (32 lanes times 1, 2, 3, 4 or 8
/// values each).
pub(crate) fn kernel_supports(head_dim: usize) -> bool {
    matches!(head_dim, 32 | 64 | 96 | 128 | 256)
}

/// The op: `apply_op3(q, keys, values)` with `q` the step's `[tokens,
/// num_heads, head_dim]` in f32, `keys` and `values` the pool's `[rows,
/// num_kv_heads * head_dim]`; gives `[seqs, num_heads * head_dim]` in f32,
/// one row per decoding sequence in the order given to [`PagedDecode::new`].
pub(crate) struct PagedDecode {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    seqs: usize,
    /// `[seqs]` context lengths, `[seqs]` query rows, `[seqs]` offsets of
    /// each block table in what follows, then the tables.
    meta: Vec<u32>,
    /// The same on the pool's device (the kernel's `meta` argument; only
    /// the CUDA launch reads it).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    meta_on_device: Tensor,
}

impl PagedDecode {
    /// The op for one step's decoding rows (each `len == 1`; its query is
    /// row `offset` of the step), with its tables uploaded to `device`.
    pub(crate) fn new(
        seqs: &[&SeqView<'_>],
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<Self> {
        let n = seqs.len();
        let mut meta = vec![0u32; 3 * n];
        for (i, s) in seqs.iter().enumerate() {
            let ctx = s.pos + 1;
            meta[i] = ctx as u32;
            meta[n + i] = s.offset as u32;
            meta[2 * n + i] = (meta.len() - 3 * n) as u32;
            meta.extend_from_slice(&s.blocks[..ctx.div_ceil(BLOCK_SIZE)]);
        }
        Ok(Self {
            num_heads,
            num_kv_heads,
            head_dim,
            seqs: n,
            meta_on_device: Tensor::new(meta.as_slice(), device)?,
            meta,
        })
    }

    fn ctx(&self, s: usize) -> usize {
        self.meta[s] as usize
    }

    /// The row of sequence `s`'s query in the step's `q`.
    fn q_row(&self, s: usize) -> usize {
        self.meta[self.seqs + s] as usize
    }

    /// The pool row of position `p` of sequence `s`.
    fn row(&self, s: usize, p: usize) -> usize {
        let table = 3 * self.seqs + self.meta[2 * self.seqs + s] as usize;
        self.meta[table + p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    fn out_shape(&self) -> Shape {
        Shape::from((self.seqs, self.num_heads * self.head_dim))
    }

    fn check(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<()> {
        let (d, nh, nkv) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let rows = (0..self.seqs).map(|s| self.q_row(s) + 1).max().unwrap_or(0);
        let fits = q.dims().len() == 3 && q.dims()[0] >= rows && q.dims()[1..] == [nh, d];
        if !fits || !q.is_contiguous() {
            candle_core::bail!(
                "paged decode: q {:?}, want [>= {rows}, {nh}, {d}]",
                q.dims()
            )
        }
        for (name, l) in [("keys", k), ("values", v)] {
            if l.dims().len() != 2 || l.dims()[1] != nkv * d || !l.is_contiguous() {
                candle_core::bail!(
                    "paged decode: {name} {:?}, want [rows, {}]",
                    l.dims(),
                    nkv * d
                )
            }
        }
        Ok(())
    }

    /// The CPU version: the kernel's arithmetic (queries rounded to `T`,
    /// f32, scores scaled after the dot product) with a two-pass softmax.
    fn cpu<T: WithDType>(&self, q: &[f32], keys: &[T], values: &[T]) -> Vec<f32> {
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let width = nkv * d;
        let mut out = vec![0f32; self.seqs * nh * d];
        let mut scores = Vec::new();
        for s in 0..self.seqs {
            let ctx = self.ctx(s);
            for h in 0..nh {
                let g = h / (nh / nkv);
                let qrow: Vec<f32> = q[(self.q_row(s) * nh + h) * d..][..d]
                    .iter()
                    .map(|&x| T::from_f64(x as f64).to_f64() as f32)
                    .collect();
                let at = |p: usize| self.row(s, p) * width + g * d;
                scores.clear();
                scores.extend((0..ctx).map(|p| {
                    let k = &keys[at(p)..][..d];
                    let dot: f32 = qrow.iter().zip(k).map(|(a, b)| a * b.to_f64() as f32).sum();
                    dot * self.scale()
                }));
                let big = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0f32;
                for x in scores.iter_mut() {
                    *x = (*x - big).exp();
                    total += *x;
                }
                let orow = &mut out[(s * nh + h) * d..][..d];
                for (p, w) in scores.iter().enumerate() {
                    let v = &values[at(p)..][..d];
                    for (o, x) in orow.iter_mut().zip(v) {
                        *o += w * x.to_f64() as f32;
                    }
                }
                orow.iter_mut().for_each(|o| *o /= total);
            }
        }
        out
    }
}

/// `storage` from `layout`'s start (the checks made it contiguous).
fn from_start<'a, T: WithDType>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    Ok(&storage.as_slice::<T>()?[layout.start_offset()..])
}

/// One call of [`PagedDecode`] as a candle op, its output's runs of 32
/// rounded to 8 bits as [`crate::layer_ops::round_q8`] rounds them with
/// `round` (for the quantized matmul it feeds; on CUDA in the kernel,
/// without another launch).
struct Call<'a> {
    op: &'a PagedDecode,
    round: bool,
}

impl CustomOp3 for Call<'_> {
    fn name(&self) -> &'static str {
        if self.round {
            "paged-decode-rounded"
        } else {
            "paged-decode"
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.op;
        op.check(l1, l2, l3)?;
        let q = from_start::<f32>(s1, l1)?;
        let mut out = match s2.dtype() {
            DType::F32 => op.cpu(q, from_start::<f32>(s2, l2)?, from_start::<f32>(s3, l3)?),
            DType::F16 => op.cpu(
                q,
                from_start::<half::f16>(s2, l2)?,
                from_start::<half::f16>(s3, l3)?,
            ),
            DType::BF16 => op.cpu(
                q,
                from_start::<half::bf16>(s2, l2)?,
                from_start::<half::bf16>(s3, l3)?,
            ),
            other => candle_core::bail!("paged decode: unsupported kv dtype {other:?}"),
        };
        if self.round {
            crate::layer_ops::round_runs(&mut out);
        }
        Ok((CpuStorage::F32(out), op.out_shape()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let op = self.op;
        op.check(l1, l2, l3)?;
        if !kernel_supports(op.head_dim) {
            candle_core::bail!("paged decode: no kernel for head_dim {}", op.head_dim)
        }
        let args = (self.round, (s1, l1), (s2, l2), (s3, l3));
        let out = match s2.dtype() {
            DType::F32 => cuda::launch::<f32>(op, "f32", args)?,
            DType::F16 => cuda::launch::<half::f16>(op, "f16", args)?,
            DType::BF16 => cuda::launch::<half::bf16>(op, "bf16", args)?,
            other => candle_core::bail!("paged decode: unsupported kv dtype {other:?}"),
        };
        Ok((out, op.out_shape()))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, Layout, Result};

    use super::PagedDecode;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_decode.ptx"));

    /// Whether to round, then `q`, keys and values with their layouts.
    type Args<'a> = (
        bool,
        (&'a CudaStorage, &'a Layout),
        (&'a CudaStorage, &'a Layout),
        (&'a CudaStorage, &'a Layout),
    );

    pub(super) fn launch<T: CudaDType + DeviceRepr>(
        op: &PagedDecode,
        suffix: &str,
        (round, (s1, l1), (s2, l2), (s3, l3)): Args<'_>,
    ) -> Result<CudaStorage> {
        let dev = s1.device();
        let q = s1.as_cuda_slice::<f32>()?.slice(l1.start_offset()..);
        let k = s2.as_cuda_slice::<T>()?.slice(l2.start_offset()..);
        let v = s3.as_cuda_slice::<T>()?.slice(l3.start_offset()..);
        let tables = crate::cuda_table::table(&op.meta_on_device, "paged decode: block tables");
        let meta = tables.view::<u32>()?;
        let n = op.seqs * op.num_heads * op.head_dim;
        // SAFETY: every element is written by the kernel.
        let out = unsafe { dev.alloc::<f32>(n)? };
        let name = format!("paged_decode_{suffix}_d{}", op.head_dim);
        let func = dev.get_or_load_custom_func(&name, "hearth_paged_decode", PTX)?;
        let (seqs, nh, nkv) = (op.seqs as i32, op.num_heads as i32, op.num_kv_heads as i32);
        let scale = op.scale();
        let mut builder = func.builder();
        builder.arg(&q);
        builder.arg(&k);
        builder.arg(&v);
        builder.arg(&meta);
        builder.arg(&out);
        builder.arg(&seqs);
        builder.arg(&nh);
        builder.arg(&nkv);
        builder.arg(&scale);
        let round = i32::from(round);
        builder.arg(&round);
        let cfg = LaunchConfig {
            grid_dim: (op.num_heads as u32, op.seqs as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature; `check` made
        // the inputs contiguous with the shapes the kernel indexes.
        unsafe { builder.launch(cfg) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// Runs the op: `q` the step's `[tokens, num_heads, head_dim]` f32; with
/// `round`, the output rounded per run of 32 (`head_dim` is a multiple of
/// 32 wherever the kernel runs).
pub(crate) fn paged_decode(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    op: &PagedDecode,
    round: bool,
) -> Result<Tensor> {
    q.apply_op3_no_bwd(keys, values, &Call { op, round })
}
