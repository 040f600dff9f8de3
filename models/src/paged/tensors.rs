//! The paged KV pool as candle tensors on the model's device (a GPU), and
//! paged attention through candle operations over it.
//!
//! Each layer holds keys and values as `[num_blocks * BLOCK_SIZE,
//! num_kv_heads * head_dim]` in the pool's dtype: row `block * 16 + slot`
//! is one token position (the CPU pool's block/slot addressing, without its
//! transposed key layout, which only the CPU loops want). A step's new keys
//! and values are scattered to their rows in place (`scatter_set`, one
//! call per layer for the whole batch). Decoding rows are attended by the
//! fused op (`fused.rs`) on CUDA; elsewhere, and for prompt chunks,
//! attention gathers the rows of each sequence through its block table
//! (`index_select`) and runs grouped-query attention with a causal mask as
//! batched matmuls and a softmax, in f32: all decoding sequences in one
//! product (contexts padded to the longest and masked), each prompt chunk
//! on its own. Queries are rounded to the storage dtype first, as the CPU
//! op does, so both give the same result up to summation order.
//!
//! A step's indices, tables and masks are the same in every layer: they
//! are built and uploaded once per step ([`StepPlan`]).
//!
//! Every operation is a candle op with kernels on CPU, CUDA and Metal (the
//! fused op has a CPU version); the tests run them on the CPU against the
//! CPU op.

use candle_core::{DType, Device, Result, Tensor};

use super::fused::{self, PagedDecode};
use super::{SeqView, BLOCK_SIZE};
use crate::layer_ops;

/// Keys and values of every layer, on one device.
#[derive(Debug, Clone)]
pub(crate) struct TensorKv {
    num_kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    device: Device,
    /// Decoding rows through the fused op ([`super::fused`]) rather than
    /// gathered copies: on CUDA, where the kernel has the head size.
    pub(super) fused: bool,
    /// Per layer: `(keys, values)`, each `[rows, num_kv_heads * head_dim]`.
    layers: Vec<(Tensor, Tensor)>,
}

impl TensorKv {
    pub(crate) fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut kv = Self {
            num_kv_heads,
            head_dim,
            dtype,
            device: device.clone(),
            fused: device.is_cuda() && fused::kernel_supports(head_dim),
            layers: Vec::with_capacity(num_layers),
        };
        for _ in 0..num_layers {
            kv.layers
                .push((kv.zeros(num_blocks)?, kv.zeros(num_blocks)?));
        }
        // Zeroed by this thread; written and read by the engine's.
        crate::settle(device)?;
        Ok(kv)
    }

    fn zeros(&self, num_blocks: usize) -> Result<Tensor> {
        let shape = (num_blocks * BLOCK_SIZE, self.num_kv_heads * self.head_dim);
        Tensor::zeros(shape, self.dtype, &self.device)
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Grows every layer to `num_blocks` blocks, keeping the contents.
    pub(crate) fn grow(&mut self, num_blocks: usize) -> Result<()> {
        let have = match self.layers.first() {
            Some((k, _)) => k.dim(0)? / BLOCK_SIZE,
            None => return Ok(()),
        };
        if num_blocks <= have {
            return Ok(());
        }
        let extra = self.zeros(num_blocks - have)?;
        for (k, v) in self.layers.iter_mut() {
            *k = Tensor::cat(&[&*k, &extra], 0)?;
            *v = Tensor::cat(&[&*v, &extra], 0)?;
        }
        crate::settle(&self.device)
    }

    /// What every layer's [`TensorKv::write`] and [`TensorKv::attend`]
    /// share within one step (`seqs` in batch order), uploaded once.
    pub(crate) fn plan(&self, seqs: &[SeqView<'_>], num_heads: usize) -> Result<StepPlan> {
        StepPlan::new(self, seqs, num_heads)
    }

    /// Writes the new rows' keys and values of `layer`: `k` and `v` are
    /// `[tokens, num_kv_heads * head_dim]` over the batch's rows.
    pub(crate) fn write(
        &self,
        layer: usize,
        plan: &StepPlan,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let (keys, values) = &self.layers[layer];
        let index = match plan.write_index.get() {
            Some(index) => index,
            None => {
                // Built by the step's first layer, kept for the others.
                let (t, width) = (plan.rows.dim(0)?, self.num_kv_heads * self.head_dim);
                let index = plan.rows.reshape((t, 1))?.broadcast_as((t, width))?;
                let _ = plan.write_index.set(index.contiguous()?);
                plan.write_index.get().expect("set just above")
            }
        };
        for (dst, src) in [(keys, k), (values, v)] {
            let src = src.to_dtype(self.dtype)?.contiguous()?;
            dst.scatter_set(index, &src, 0)?;
        }
        Ok(())
    }

    /// [`TensorKv::write`] of keys and values as they leave the
    /// projections (`[tokens, num_kv_heads * head_dim]` f32): the keys are
    /// rotated by `rope` on the way in. One op each (`layer_ops.rs`).
    pub(crate) fn write_rows(
        &self,
        layer: usize,
        plan: &StepPlan,
        k: &Tensor,
        v: &Tensor,
        rope: layer_ops::Rope<'_>,
    ) -> Result<()> {
        let (keys, values) = &self.layers[layer];
        let nkv = self.num_kv_heads;
        layer_ops::write_rows(keys, k, &plan.rows, Some(rope), nkv)?;
        layer_ops::write_rows(values, v, &plan.rows, None, nkv)
    }

    /// Causal attention of every sequence's new rows over its cached and
    /// new keys of `layer` (already written). `q` is `[tokens, num_heads,
    /// head_dim]`; returns `[tokens, num_heads * head_dim]` in f32.
    ///
    /// Sequences decoding one token are attended together (through the
    /// fused op, or their contexts gathered side by side, padded to the
    /// longest and masked); prompt chunks one sequence at a time.
    ///
    /// With `round_out`, the fused op rounds its output per run of 32 for the
    /// quantized matmul it feeds; the second value says whether the whole
    /// result came out rounded (every row from that op).
    pub(crate) fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        plan: &StepPlan,
        round_out: bool,
    ) -> Result<(Tensor, bool)> {
        let (t, nh, d) = q.dims3()?;
        // Queries are rounded to the storage precision (as the CPU op does
        // it): by the fused op as it loads them, here for the others.
        let q = q.to_dtype(DType::F32)?;
        let round = |q: Tensor| q.to_dtype(self.dtype)?.to_dtype(DType::F32);
        // Outputs in this order: the decoding rows, then each chunk's rows.
        let mut parts = Vec::with_capacity(plan.chunks.len() + 1);
        let round_out = round_out && plan.chunks.is_empty();
        let mut rounded = false;
        match &plan.decode {
            Some(Decode::Fused(op)) => {
                let (keys, values) = &self.layers[layer];
                parts.push(fused::paged_decode(&q, keys, values, op, round_out)?);
                rounded = round_out;
            }
            Some(Decode::Gathered(g)) => {
                let qs = round(q.index_select(&g.at, 0)?)?; // [b, nh, d]
                parts.push(self.attend_gathered(layer, &qs, g)?);
            }
            None => {}
        }
        for c in &plan.chunks {
            let qs = round(q.narrow(0, c.offset, c.len)?)?; // [len, nh, d]
            parts.push(self.attend_chunk(layer, &qs, c)?);
        }
        let y = if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Tensor::cat(&parts, 0)?
        };
        debug_assert_eq!(y.dims2()?, (t, nh * d));
        // Back to batch order where the groups interleave (whole rows:
        // rounded rows stay rounded).
        let y = match &plan.inverse {
            Some(inverse) => y.index_select(inverse, 0)?,
            None => y,
        };
        Ok((y, rounded))
    }

    /// One sequence's chunk, `q` its `[len, num_heads, head_dim]`: `[len,
    /// num_heads * head_dim]`.
    fn attend_chunk(&self, layer: usize, q: &Tensor, c: &Chunk) -> Result<Tensor> {
        let (keys, values) = &self.layers[layer];
        let (len, nh, d) = q.dims3()?;
        let nkv = self.num_kv_heads;
        let n_rep = nh / nkv;
        // [ctx, nkv * d] -> [nkv, ctx, d]
        let gather = |m: &Tensor| -> Result<Tensor> {
            m.index_select(&c.rows, 0)?
                .to_dtype(DType::F32)?
                .reshape((c.ctx, nkv, d))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (k, v) = (gather(keys)?, gather(values)?);
        // Query head h = g * n_rep + r reads KV head g: stack the heads of
        // a group as rows of one matmul.
        let qs = q
            .transpose(0, 1)?
            .contiguous()?
            .reshape((nkv, n_rep * len, d))?;
        let scores = (qs.matmul(&k.t()?)? * scale(d))?; // [nkv, n_rep * len, ctx]
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&c.mask)?)?;
        let y = probs.matmul(&v)?; // [nkv, n_rep * len, d]
        y.reshape((nh, len, d))?
            .transpose(0, 1)?
            .reshape((len, nh * d))
    }

    /// Sequences with one new row each, together, `q` their `[seqs,
    /// num_heads, head_dim]`: `[seqs, num_heads * head_dim]`.
    fn attend_gathered(&self, layer: usize, q: &Tensor, g: &Gathered) -> Result<Tensor> {
        let (keys, values) = &self.layers[layer];
        let (b, nh, d) = q.dims3()?;
        let nkv = self.num_kv_heads;
        // [b * ctx, nkv * d] -> [b, nkv, ctx, d]
        let gather = |m: &Tensor| -> Result<Tensor> {
            m.index_select(&g.rows, 0)?
                .to_dtype(DType::F32)?
                .reshape((b, g.ctx, nkv, d))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (k, v) = (gather(keys)?, gather(values)?);
        let qs = q.reshape((b, nkv, nh / nkv, d))?;
        let scores = (qs.matmul(&k.transpose(2, 3)?)? * scale(d))?; // [b, nkv, n_rep, ctx]
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&g.mask)?)?;
        probs.matmul(&v)?.reshape((b, nh * d)) // [b, nkv, n_rep, d]
    }
}

/// Per step, what every layer's write and attention over the tensor pool
/// reuse: the scatter index, block tables, gathered rows and masks go to
/// the device once per step instead of once per layer (a GPU step is a few
/// hundred small launches; each upload and index build is one more).
pub(crate) struct StepPlan {
    /// `[tokens]`: each new row's pool row.
    rows: Tensor,
    /// `rows` repeated across each row, the scatter's index of
    /// [`TensorKv::write`] (candle's operations; the layer ops read `rows`).
    write_index: std::cell::OnceCell<Tensor>,
    decode: Option<Decode>,
    chunks: Vec<Chunk>,
    /// Output rows back to batch order, when decoding rows and chunks
    /// interleave.
    inverse: Option<Tensor>,
}

/// The decoding rows of a step.
enum Decode {
    Fused(PagedDecode),
    Gathered(Gathered),
}

/// Decoding rows through gathered copies: each sequence's context rows
/// side by side, padded with row 0 to the longest and masked.
struct Gathered {
    /// The rows of `q` that decode.
    at: Tensor,
    ctx: usize,
    /// `[seqs * ctx]` pool rows.
    rows: Tensor,
    /// `[seqs, 1, 1, ctx]`.
    mask: Tensor,
}

/// One sequence's prompt chunk.
struct Chunk {
    offset: usize,
    len: usize,
    ctx: usize,
    /// `[ctx]` pool rows of its positions `0..ctx`.
    rows: Tensor,
    /// `[1, n_rep * len, ctx]` causal mask.
    mask: Tensor,
}

impl StepPlan {
    fn new(kv: &TensorKv, seqs: &[SeqView<'_>], num_heads: usize) -> Result<Self> {
        let dev = &kv.device;
        let new_rows = pool_rows(seqs);
        let t = new_rows.len();
        let (decode, chunks): (Vec<&SeqView<'_>>, Vec<&SeqView<'_>>) =
            seqs.iter().partition(|s| s.len == 1);
        let mut order: Vec<u32> = decode.iter().map(|s| s.offset as u32).collect();
        let decode = match decode.is_empty() {
            true => None,
            false if kv.fused => Some(Decode::Fused(PagedDecode::new(
                &decode,
                num_heads,
                kv.num_kv_heads,
                kv.head_dim,
                dev,
            )?)),
            false => Some(Decode::Gathered(Gathered::new(&decode, dev)?)),
        };
        let n_rep = num_heads / kv.num_kv_heads;
        let chunks = chunks
            .iter()
            .map(|s| {
                order.extend((s.offset..s.offset + s.len).map(|r| r as u32));
                let ctx = s.pos + s.len;
                let mask = causal_mask(s.pos, s.len, n_rep);
                Ok(Chunk {
                    offset: s.offset,
                    len: s.len,
                    ctx,
                    rows: Tensor::new(pool_rows_of(s.blocks, 0, ctx).as_slice(), dev)?,
                    mask: Tensor::from_vec(mask, (1, n_rep * s.len, ctx), dev)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let inverse = if order.iter().enumerate().all(|(i, &r)| r as usize == i) {
            None
        } else {
            let mut inverse = vec![0u32; t];
            for (i, &r) in order.iter().enumerate() {
                inverse[r as usize] = i as u32;
            }
            Some(Tensor::new(inverse.as_slice(), dev)?)
        };
        Ok(Self {
            rows: Tensor::new(new_rows.as_slice(), dev)?,
            write_index: std::cell::OnceCell::new(),
            decode,
            chunks,
            inverse,
        })
    }
}

impl Gathered {
    fn new(seqs: &[&SeqView<'_>], dev: &Device) -> Result<Self> {
        let b = seqs.len();
        let ctx = seqs.iter().map(|s| s.pos + 1).max().unwrap_or(1);
        let mut rows = Vec::with_capacity(b * ctx);
        let mut mask = vec![0f32; b * ctx];
        for (i, s) in seqs.iter().enumerate() {
            let n = s.pos + 1;
            rows.extend(pool_rows_of(s.blocks, 0, n));
            rows.resize((i + 1) * ctx, 0);
            mask[i * ctx + n..(i + 1) * ctx].fill(f32::NEG_INFINITY);
        }
        let at: Vec<u32> = seqs.iter().map(|s| s.offset as u32).collect();
        Ok(Self {
            at: Tensor::new(at.as_slice(), dev)?,
            ctx,
            rows: Tensor::new(rows.as_slice(), dev)?,
            mask: Tensor::from_vec(mask, (b, 1, 1, ctx), dev)?,
        })
    }
}

fn scale(head_dim: usize) -> f64 {
    1.0 / (head_dim as f64).sqrt()
}

/// The pool rows of positions `from..to` of a sequence with block table
/// `blocks`.
fn pool_rows_of(blocks: &[u32], from: usize, to: usize) -> Vec<u32> {
    (from..to)
        .map(|p| blocks[p / BLOCK_SIZE] * BLOCK_SIZE as u32 + (p % BLOCK_SIZE) as u32)
        .collect()
}

/// The pool row of every new row of the batch, in batch order.
fn pool_rows(seqs: &[SeqView<'_>]) -> Vec<u32> {
    let mut rows = Vec::new();
    for s in seqs {
        rows.extend(pool_rows_of(s.blocks, s.pos, s.pos + s.len));
    }
    rows
}

/// Additive mask `[n_rep * len, pos + len]`: row `r * len + i` (query at
/// position `pos + i`) sees keys `0..=pos + i`.
fn causal_mask(pos: usize, len: usize, n_rep: usize) -> Vec<f32> {
    let ctx = pos + len;
    let mut m = vec![0f32; n_rep * len * ctx];
    for r in 0..n_rep {
        for i in 0..len {
            let row = &mut m[(r * len + i) * ctx..(r * len + i + 1) * ctx];
            row[pos + i + 1..].fill(f32::NEG_INFINITY);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paged::{paged_attention, AttnShape, KvPool};

    /// Deterministic values in [-1, 1).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Sequences' block tables and each step's new rows per sequence:
    /// blocks scattered over the pool, a prefill, decode steps, a chunk
    /// beside decoding rows (either order).
    struct Case {
        tables: [Vec<u32>; 3],
        steps: Vec<[usize; 3]>,
    }

    fn short_case() -> Case {
        Case {
            tables: [vec![7, 2, 9], vec![0], vec![11, 4, 5, 1]],
            steps: vec![[20, 5, 40], [1, 1, 1], [1, 9, 1], [3, 1, 1]],
        }
    }

    /// Contexts of hundreds of positions (every warp of the CUDA kernel
    /// takes many keys), tables in reverse pool order.
    fn long_case() -> Case {
        let table = |from: u32| (0..24).map(|b| from + 23 - b).collect();
        Case {
            tables: [table(0), table(24), table(48)],
            steps: vec![[300, 17, 129], [1, 1, 1], [1, 40, 1], [1, 1, 1]],
        }
    }

    /// Runs the same steps through the CPU pool and op and through the
    /// tensor pool on `dev` (decoding rows through the fused op or not),
    /// and returns the largest difference of the outputs.
    fn compare(
        dev: &Device,
        fused: bool,
        case: &Case,
        (dtype, nh, nkv, d): (DType, usize, usize, usize),
    ) -> Result<f32> {
        let layers = 2;
        let blocks = 1 + *case.tables.iter().flatten().max().expect("blocks") as usize;
        let mut cpu = KvPool::new(layers, nkv, d, blocks, dtype)?;
        let mut kv = TensorKv::new(layers, nkv, d, blocks, dtype, dev)?;
        kv.fused = fused;
        let mut pos = [0usize; 3];
        let mut worst = 0f32;
        for (step, lens) in case.steps.iter().enumerate() {
            let mut views = Vec::new();
            let mut offset = 0;
            for s in 0..3 {
                views.push(SeqView {
                    blocks: &case.tables[s],
                    pos: pos[s],
                    offset,
                    len: lens[s],
                });
                offset += lens[s];
            }
            let t = offset;
            let plan = kv.plan(&views, nh)?;
            for layer in 0..layers {
                let seed = (step * 10 + layer) as u64;
                let q = values(seed, nh * t * d);
                let k = values(seed + 100, nkv * t * d);
                let v = values(seed + 200, nkv * t * d);
                for view in &views {
                    cpu.write(layer, view, &k, &v, t);
                }
                let shape = AttnShape {
                    num_heads: nh,
                    tokens: t,
                };
                let want = paged_attention(&cpu, layer, &q, shape, &views);
                // The CPU op's head-major rows, token-major here.
                let token_major = |x: Vec<f32>, n: usize| -> Result<Tensor> {
                    Tensor::from_vec(x, (n, t, d), dev)?
                        .transpose(0, 1)?
                        .contiguous()
                };
                let tk = token_major(k, nkv)?.reshape((t, nkv * d))?;
                let tv = token_major(v, nkv)?.reshape((t, nkv * d))?;
                kv.write(layer, &plan, &tk, &tv)?;
                let q = token_major(q, nh)?;
                let (got, _) = kv.attend(layer, &q, &plan, false)?;
                assert_eq!(got.dims2()?, (t, nh * d));
                if d % 32 == 0 {
                    // Asked to round: the fused op's output rounded as
                    // `round_q8` rounds it, when every row came from it;
                    // otherwise untouched and said so.
                    let (got_r, rounded) = kv.attend(layer, &q, &plan, true)?;
                    let decoding_only = lens.iter().all(|&l| l == 1);
                    assert_eq!(rounded, fused && decoding_only, "step {step}");
                    let want_r = if rounded {
                        crate::layer_ops::round_q8(&got)?
                    } else {
                        got.clone()
                    };
                    let diff = crate::test_util::max_diff(&got_r, &want_r)?;
                    assert!(diff < 1e-6, "step {step}, rounded {rounded}: {diff}");
                }
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                for (a, b) in got.iter().zip(&want) {
                    worst = worst.max((a - b).abs());
                }
            }
            for s in 0..3 {
                pos[s] += lens[s];
            }
        }
        Ok(worst)
    }

    const SHAPES: [(DType, usize, usize, usize); 4] = [
        (DType::F32, 4, 2, 8),
        (DType::F16, 4, 2, 8),
        (DType::BF16, 6, 3, 16),
        (DType::F16, 4, 4, 64),
    ];

    #[test]
    fn tensor_pool_attention_matches_the_cpu_op() -> Result<()> {
        for fused in [false, true] {
            for shape in SHAPES {
                let diff = compare(&Device::Cpu, fused, &short_case(), shape)?;
                assert!(diff < 1e-5, "{shape:?} fused {fused}: {diff}");
            }
        }
        let shape = (DType::BF16, 8, 2, 32);
        let diff = compare(&Device::Cpu, true, &long_case(), shape)?;
        assert!(diff < 1e-5, "long {shape:?}: {diff}");
        Ok(())
    }

    /// The CUDA kernel (and the gathered path on the GPU) against the CPU
    /// op, for every head size the kernel is built for.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_paged_decode_kernel_matches_the_cpu_op() -> Result<()> {
        let Some(dev) = crate::test_util::test_cuda() else {
            return Ok(());
        };
        let shapes = [
            (DType::F32, 4, 2, 32),
            (DType::F16, 32, 8, 64),
            (DType::BF16, 32, 8, 64),
            (DType::F16, 6, 2, 96),
            (DType::BF16, 32, 8, 128),
            (DType::F32, 8, 8, 128),
            (DType::F16, 4, 1, 256),
        ];
        for shape in shapes {
            assert!(fused::kernel_supports(shape.3));
            for case in [short_case(), long_case()] {
                for fused in [true, false] {
                    let diff = compare(&dev, fused, &case, shape)?;
                    assert!(diff < 1e-4, "cuda {shape:?} fused {fused}: {diff}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn tensor_pool_grows_and_keeps_contents() -> Result<()> {
        let dev = Device::Cpu;
        let mut pool = KvPool::on_device(1, 1, 2, 1, DType::F32, &dev)?;
        let view = SeqView {
            blocks: &[0],
            pos: 3,
            offset: 0,
            len: 1,
        };
        assert_eq!(pool_rows(&[view]), [3]);
        let kv = pool.tensors().unwrap();
        let plan = kv.plan(&[view], 1)?;
        let k = Tensor::new(&[[1f32, 2.]], &dev)?;
        let v = Tensor::new(&[[5f32, 6.]], &dev)?;
        kv.write(0, &plan, &k, &v)?;
        pool.grow(3)?;
        assert_eq!(pool.num_blocks(), 3);
        let (keys, values) = &pool.tensors().unwrap().layers[0];
        assert_eq!(keys.dims2()?, (3 * BLOCK_SIZE, 2));
        assert_eq!(keys.get(3)?.to_vec1::<f32>()?, [1., 2.]);
        assert_eq!(values.get(3)?.to_vec1::<f32>()?, [5., 6.]);
        assert_eq!(values.get(4)?.to_vec1::<f32>()?, [0., 0.]);
        Ok(())
    }

    #[test]
    fn causal_mask_hides_later_positions_in_every_head_group() {
        let m = causal_mask(2, 2, 2);
        let inf = f32::NEG_INFINITY;
        let want = [0., 0., 0., inf, 0., 0., 0., 0.];
        assert_eq!(&m[..8], &want);
        assert_eq!(&m[8..], &want);
    }
}
