//! Paged key/value storage ([`KvPool`]) and the CPU attention op over block
//! tables ([`paged_attention`]).
//!
//! The pool is a fixed array of blocks of [`BLOCK_SIZE`] token positions.
//! For every layer it holds one value buffer laid out as `[num_blocks,
//! num_kv_heads, BLOCK_SIZE, head_dim]` and one key buffer with each
//! block's keys transposed, `[num_blocks, num_kv_heads, head_dim,
//! BLOCK_SIZE]` (dimension `c` of the block's 16 keys contiguous, the order
//! in which attention multiplies them), so the 16 keys or values of one
//! head in one block are contiguous. A sequence owns an ordered list of block
//! ids (its block table): position `p` lives in block `table[p / 16]`, slot
//! `p % 16`. Who owns which block is decided outside the model (the engine's
//! block manager); the model only writes the new tokens' keys and values at
//! their positions and reads them back through the tables.
//!
//! Buffers are allocated zeroed (`calloc`), so the operating system maps
//! pages only as blocks are first written: a large pool costs resident
//! memory only for the blocks in use.
//!
//! Attention runs per sequence, per KV head, over chunks of query rows, on
//! rayon: each task converts one key block and one value block to f32 at a
//! time and folds it into every query row of the task with an online
//! softmax (running max, running sum, rescaled accumulator), so no score
//! matrix is materialised and a block is converted once for all the query
//! heads that share its KV head. The loops are compiled for AVX2 + FMA
//! where the CPU has them (`attend.rs`, `vecmath.rs`): a query's 16 scores
//! against a block are two 8-wide accumulators over the head dimension (the
//! keys are stored transposed), and the exponentials are a polynomial, not
//! a library call per score. On AVX-512 CPUs the same operations run on
//! 512-bit registers (`attend_wide.rs`: tiles of 8 queries for the scores,
//! up to 4 queries sharing each loaded value row; prompt tasks' scores and
//! softmax with 16 queries in the lanes, `attend_tiles.rs`), with the same
//! bits.

use candle_core::{DType, Result};
use half::bf16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rayon::prelude::*;

mod attend;
#[cfg(target_arch = "x86_64")]
mod attend_tiles;
#[cfg(target_arch = "x86_64")]
mod attend_wide;
mod fused;
mod tensors;

use attend::{Next, Task};
pub(crate) use tensors::{StepPlan, TensorKv};

/// Token positions per block.
pub const BLOCK_SIZE: usize = 16;

/// Query-key multiply-adds from which attention runs on the pool.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Query rows per attention task (a long prefill is split into tasks).
const ROWS_PER_TASK: usize = 32;

/// One layer's keys or values, in the pool's storage dtype.
#[derive(Debug, Clone)]
enum Store {
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    F32(Vec<f32>),
}

impl Store {
    fn zeros(dtype: DType, n: usize) -> Result<Self> {
        Ok(match dtype {
            DType::F16 => Store::F16(vec![0; n]),
            DType::BF16 => Store::Bf16(vec![0; n]),
            DType::F32 => Store::F32(vec![0.0; n]),
            other => candle_core::bail!("unsupported kv cache dtype {other:?}"),
        })
    }

    fn resize(&mut self, n: usize) {
        match self {
            Store::F16(v) | Store::Bf16(v) => v.resize(n, 0),
            Store::F32(v) => v.resize(n, 0.0),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        let end = at + src.len();
        match self {
            Store::F16(v) => crate::vecmath::f32_to_f16(src, &mut v[at..end]),
            Store::Bf16(v) => v[at..end]
                .reinterpret_cast_mut::<bf16>()
                .convert_from_f32_slice(src),
            Store::F32(v) => v[at..end].copy_from_slice(src),
        }
    }

    /// `src[i]` to element `at + i * stride`.
    fn write_strided(&mut self, at: usize, src: &[f32], stride: usize) {
        fn put<S, T>(v: &mut [T], at: usize, src: &[S], stride: usize, conv: impl Fn(&S) -> T) {
            for (i, x) in src.iter().enumerate() {
                v[at + i * stride] = conv(x);
            }
        }
        match self {
            Store::F16(v) => {
                // Converted eight at a time, then scattered.
                let mut h = [0u16; 128];
                for (c, src) in src.chunks(h.len()).enumerate() {
                    let h = &mut h[..src.len()];
                    crate::vecmath::f32_to_f16(src, h);
                    put(v, at + c * 128 * stride, h, stride, |x| *x);
                }
            }
            Store::Bf16(v) => put(v, at, src, stride, |&x| bf16::from_f32(x).to_bits()),
            Store::F32(v) => put(v, at, src, stride, |&x| x),
        }
    }

    fn read(&self, at: usize, dst: &mut [f32]) {
        let end = at + dst.len();
        match self {
            Store::F16(v) => crate::vecmath::f16_to_f32(&v[at..end], dst),
            Store::Bf16(v) => v[at..end]
                .reinterpret_cast::<bf16>()
                .convert_to_f32_slice(dst),
            Store::F32(v) => dst.copy_from_slice(&v[at..end]),
        }
    }
}

/// Rounds `x` to the storage precision of `dtype` (what a half-precision
/// attention kernel does to its queries); identity for f32.
fn round_to(dtype: DType, x: &mut [f32]) {
    match dtype {
        DType::F16 => crate::vecmath::round_f16(x),
        DType::BF16 => x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// Keys and values of every layer for a fixed number of blocks.
#[derive(Debug, Clone)]
pub struct KvPool {
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    dtype: DType,
    keys: Vec<Store>,
    values: Vec<Store>,
    /// The pool as tensors on a device instead (then `keys` and `values`
    /// are empty): see `tensors.rs`.
    tensors: Option<TensorKv>,
}

impl KvPool {
    /// A pool of `num_blocks` blocks; memory is mapped lazily as blocks are
    /// written.
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
        dtype: DType,
    ) -> Result<Self> {
        let n = num_blocks * num_kv_heads * BLOCK_SIZE * head_dim;
        // One allocation each (cloning would touch every page).
        let stores = || {
            (0..num_layers)
                .map(|_| Store::zeros(dtype, n))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Self {
            num_layers,
            num_kv_heads,
            head_dim,
            num_blocks,
            dtype,
            keys: stores()?,
            values: stores()?,
            tensors: None,
        })
    }

    /// A pool of `num_blocks` blocks held as candle tensors on `device`
    /// (allocated at once), for models that run there; attention then runs
    /// through candle operations (`tensors.rs`). On the CPU this is only for
    /// comparisons: [`KvPool::new`] is faster there.
    pub fn on_device(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
            candle_core::bail!("unsupported kv cache dtype {dtype:?}")
        }
        let kv = TensorKv::new(
            num_layers,
            num_kv_heads,
            head_dim,
            num_blocks,
            dtype,
            device,
        )?;
        Ok(Self {
            num_layers,
            num_kv_heads,
            head_dim,
            num_blocks,
            dtype,
            keys: Vec::new(),
            values: Vec::new(),
            tensors: Some(kv),
        })
    }

    /// On a pool made by [`KvPool::on_device`], sends decoding rows through
    /// the fused op (`fused.rs`) whatever the device: off CUDA, its CPU
    /// version, the CUDA kernel's reference. For tests of a whole model's
    /// path through it; CUDA pools use it by themselves.
    pub fn fuse_decoding_rows(&mut self) {
        if let Some(kv) = &mut self.tensors {
            kv.fused = true;
        }
    }

    /// The tensors of a pool made by [`KvPool::on_device`].
    pub(crate) fn tensors(&self) -> Option<&TensorKv> {
        self.tensors.as_ref()
    }

    /// The device holding the keys and values.
    pub fn device(&self) -> candle_core::Device {
        match &self.tensors {
            Some(t) => t.device().clone(),
            None => candle_core::Device::Cpu,
        }
    }

    /// Bytes one block takes over all layers, keys and values.
    pub fn block_bytes(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: DType,
    ) -> usize {
        2 * num_layers * num_kv_heads * BLOCK_SIZE * head_dim * dtype.size_in_bytes()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of the whole pool (address space; resident only when written).
    pub fn size_in_bytes(&self) -> usize {
        self.num_blocks
            * Self::block_bytes(
                self.num_layers,
                self.num_kv_heads,
                self.head_dim,
                self.dtype,
            )
    }

    /// Grows the pool to `num_blocks` blocks (no-op when not larger); used by
    /// the single-sequence [`crate::KvCache`].
    pub fn grow(&mut self, num_blocks: usize) -> Result<()> {
        if num_blocks <= self.num_blocks {
            return Ok(());
        }
        if let Some(t) = &mut self.tensors {
            t.grow(num_blocks)?;
        }
        let n = num_blocks * self.num_kv_heads * BLOCK_SIZE * self.head_dim;
        for s in self.keys.iter_mut().chain(self.values.iter_mut()) {
            s.resize(n);
        }
        self.num_blocks = num_blocks;
        Ok(())
    }

    /// Element offset of `(block, head, slot)` in a layer's value buffer;
    /// with `slot` 0, where `(block, head)` starts in either buffer.
    fn offset(&self, block: u32, head: usize, slot: usize) -> usize {
        ((block as usize * self.num_kv_heads + head) * BLOCK_SIZE + slot) * self.head_dim
    }

    /// Writes the keys and values of `seq`'s new tokens for `layer`. `k` and
    /// `v` are `[num_kv_heads, tokens, head_dim]` over all `tokens` rows of the
    /// batch; the sequence's rows are `seq.offset..seq.offset + seq.len`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        seq: &SeqView<'_>,
        k: &[f32],
        v: &[f32],
        tokens: usize,
    ) {
        let d = self.head_dim;
        for i in 0..seq.len {
            let p = seq.pos + i;
            let block = seq.blocks[p / BLOCK_SIZE];
            for g in 0..self.num_kv_heads {
                let src = (g * tokens + seq.offset + i) * d;
                let (base, slot) = (self.offset(block, g, 0), p % BLOCK_SIZE);
                self.keys[layer].write_strided(base + slot, &k[src..src + d], BLOCK_SIZE);
                self.values[layer].write(base + slot * d, &v[src..src + d]);
            }
        }
    }

    /// Reads the keys (`[d, 16]`, transposed) or values (`[16, d]`) of one
    /// head in one block as f32.
    fn read_block(&self, layer: usize, values: bool, block: u32, head: usize, dst: &mut [f32]) {
        self.store(layer, values)
            .read(self.offset(block, head, 0), dst);
    }

    /// `layer`'s values, or its keys.
    fn store(&self, layer: usize, values: bool) -> &Store {
        if values {
            &self.values[layer]
        } else {
            &self.keys[layer]
        }
    }

    /// Asks for the keys and values of one KV head's block to be brought
    /// into the cache ahead of a decode task's use: a head's block is a
    /// short run (16 positions) that the other heads' rows of the block
    /// separate from its next one, which the hardware prefetchers do not
    /// follow far (1B Q4_K_M tg128 at depth 4096: 8-10% faster with it).
    fn prefetch_block(&self, layer: usize, block: u32, head: usize) {
        let at = self.offset(block, head, 0);
        let n = BLOCK_SIZE * self.head_dim;
        for values in [false, true] {
            let (start, bytes) = match self.store(layer, values) {
                Store::F16(v) | Store::Bf16(v) => (v[at..at + n].as_ptr().cast::<i8>(), 2 * n),
                Store::F32(v) => (v[at..at + n].as_ptr().cast::<i8>(), 4 * n),
            };
            #[cfg(target_arch = "x86_64")]
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch hint has no effect on memory (and these
                // addresses are the block's).
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        start.wrapping_add(line),
                    )
                };
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (start, bytes);
        }
    }

    /// The f16 bits of one KV head's block (as [`KvPool::read_block`]
    /// reads it), where the pool stores f16; `None` otherwise.
    fn block_f16(&self, layer: usize, values: bool, block: u32, head: usize) -> Option<&[u16]> {
        let at = self.offset(block, head, 0);
        match self.store(layer, values) {
            Store::F16(v) => Some(&v[at..at + BLOCK_SIZE * self.head_dim]),
            _ => None,
        }
    }
}

/// One sequence's slice of a flattened batch: rows `offset..offset+len` of
/// the batch's activations, at positions `pos..pos+len`, whose keys and
/// values live in the blocks of `blocks`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqView<'a> {
    pub(crate) blocks: &'a [u32],
    pub(crate) pos: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnShape {
    pub(crate) num_heads: usize,
    /// Rows of the whole batch.
    pub(crate) tokens: usize,
}

/// Causal attention of every sequence's new rows over its cached and new
/// keys (already written with [`KvPool::write`]). `q` is `[num_heads,
/// tokens, head_dim]` (rotated); returns `[tokens, num_heads * head_dim]`.
/// Query head `h` reads KV head `h / (num_heads / num_kv_heads)`.
pub(crate) fn paged_attention(
    pool: &KvPool,
    layer: usize,
    q: &[f32],
    shape: AttnShape,
    seqs: &[SeqView<'_>],
) -> Vec<f32> {
    let (nh, t, d) = (shape.num_heads, shape.tokens, pool.head_dim);
    let nkv = pool.num_kv_heads;
    let n_rep = nh / nkv;
    let mut tasks = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        for g in 0..nkv {
            for r0 in (0..seq.len).step_by(ROWS_PER_TASK) {
                tasks.push((s, g, r0, (r0 + ROWS_PER_TASK).min(seq.len)));
            }
        }
    }
    let task = |&(s, g, r0, r1): &(usize, usize, usize, usize)| Task {
        pool,
        layer,
        q,
        shape,
        seq: &seqs[s],
        g,
        r0,
        r1,
        next: None,
    };
    let run = |(i, t): (usize, &(usize, usize, usize, usize))| {
        let next = tasks.get(i + 1).map(task).filter(Task::is_decode);
        Task {
            next: next.map(|n| Next {
                seq: n.seq,
                g: n.g,
                last: n.last_block(),
            }),
            ..task(t)
        }
        .attend()
    };
    // Query-key products of the whole call: worth the pool from a few
    // tens of microseconds of work (one decoding sequence past ~100
    // positions).
    let work: usize = seqs.iter().map(|s| s.len * (s.pos + s.len)).sum::<usize>() * nh * d;
    let results: Vec<Vec<f32>> = if tasks.len() > 1 && work >= PARALLEL_MIN_WORK {
        tasks.par_iter().enumerate().map(run).collect()
    } else {
        tasks.iter().enumerate().map(run).collect()
    };
    let mut out = vec![0f32; t * nh * d];
    for (&(s, g, r0, r1), res) in tasks.iter().zip(&results) {
        let seq = &seqs[s];
        for i in r0..r1 {
            for r in 0..n_rep {
                let h = g * n_rep + r;
                let src = ((i - r0) * n_rep + r) * d;
                let dst = (seq.offset + i) * nh * d + h * d;
                out[dst..dst + d].copy_from_slice(&res[src..src + d]);
            }
        }
    }
    out
}

/// The paged-attention op on its own, as a model layer runs it: writes the
/// new rows' keys and values of every sequence into `pool` (layer `layer`)
/// at the sequence's positions, then attends. The rows of `seqs` are
/// flattened in order (`tokens` rows in all); `q` is `[num_heads, tokens,
/// head_dim]`, `k` and `v` `[num_kv_heads, tokens, head_dim]`; the result is
/// `[tokens, num_heads * head_dim]`. For benches and tests outside the
/// crate; inputs are not validated beyond the slices' own bounds checks.
pub fn paged_attention_step(
    pool: &mut KvPool,
    layer: usize,
    num_heads: usize,
    seqs: &[crate::PagedSeq<'_>],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    let mut views = Vec::with_capacity(seqs.len());
    let mut offset = 0;
    for s in seqs {
        views.push(SeqView {
            blocks: s.blocks,
            pos: s.pos,
            offset,
            len: s.tokens.len(),
        });
        offset += s.tokens.len();
    }
    for view in &views {
        pool.write(layer, view, k, v, offset);
    }
    let shape = AttnShape {
        num_heads,
        tokens: offset,
    };
    paged_attention(pool, layer, q, shape, &views)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Plain softmax attention of one sequence in candle: q `[nh, n, d]` at
    /// positions `pos..pos+n` over keys/values `[nkv, pos+n, d]`.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize) -> Result<Tensor> {
        let (nh, n, d) = q.dims3()?;
        let (nkv, total, _) = k.dims3()?;
        let rep = nh / nkv;
        let k = k
            .unsqueeze(1)?
            .repeat((1, rep, 1, 1))?
            .reshape((nh, total, d))?;
        let v = v
            .unsqueeze(1)?
            .repeat((1, rep, 1, 1))?
            .reshape((nh, total, d))?;
        let att = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (n, total), q.device())?;
        let att = candle_nn::ops::softmax_last_dim(&att.broadcast_add(&mask)?)?;
        att.matmul(&v)?.transpose(0, 1)?.reshape((n, nh * d))
    }

    /// Two sequences in scattered, non-contiguous blocks, one decoding and
    /// one prefilling a chunk that crosses block boundaries, against the
    /// reference, in f32 and f16 storage.
    #[test]
    fn matches_plain_attention_over_scattered_blocks() -> Result<()> {
        let dev = Device::Cpu;
        // d = 64 takes the AVX2 value path (multiples of 32) where present.
        for (d, dtype) in [
            (8, DType::F32),
            (8, DType::F16),
            (64, DType::F32),
            (64, DType::F16),
        ] {
            let (nh, nkv) = (6, 2);
            let mut pool = KvPool::new(1, nkv, d, 12, dtype)?;
            // (blocks, cached tokens, new tokens)
            let cases: [(&[u32], usize, usize); 2] =
                [(&[7, 2, 9], 40, 1), (&[3, 11, 0, 5], 13, 45)];
            let mut full = Vec::new();
            for &(blocks, pos, len) in &cases {
                let total = pos + len;
                let k = Tensor::randn(0f32, 1.0, (nkv, total, d), &dev)?;
                let v = Tensor::randn(0f32, 1.0, (nkv, total, d), &dev)?;
                let q = Tensor::randn(0f32, 1.0, (nh, len, d), &dev)?;
                // Cache the first `pos` tokens as an earlier step would.
                let view = SeqView {
                    blocks,
                    pos: 0,
                    offset: 0,
                    len: pos,
                };
                let kv = |x: &Tensor| -> Result<Vec<f32>> {
                    x.narrow(1, 0, pos)?.flatten_all()?.to_vec1()
                };
                pool.write(0, &view, &kv(&k)?, &kv(&v)?, pos);
                full.push((blocks, pos, len, q, k, v));
            }
            // The new rows of both sequences flattened into one batch.
            let tokens: usize = cases.iter().map(|c| c.2).sum();
            let cat = |i: usize| -> Result<Vec<f32>> {
                let parts: Vec<Tensor> = full
                    .iter()
                    .map(|f| {
                        let x = [&f.3, &f.4, &f.5][i];
                        let n = x.dim(1)?;
                        x.narrow(1, n - f.2, f.2)
                    })
                    .collect::<Result<_>>()?;
                Tensor::cat(&parts, 1)?.flatten_all()?.to_vec1()
            };
            let (q, k, v) = (cat(0)?, cat(1)?, cat(2)?);
            // Through the public entry point: writes the new rows, attends.
            let ids: Vec<Vec<u32>> = full.iter().map(|f| vec![0; f.2]).collect();
            let seqs: Vec<crate::PagedSeq<'_>> = full
                .iter()
                .zip(&ids)
                .map(|(f, ids)| crate::PagedSeq::new(ids, f.1, f.0))
                .collect();
            let got = paged_attention_step(&mut pool, 0, nh, &seqs, &q, &k, &v);
            let got = Tensor::from_vec(got, (tokens, nh * d), &dev)?;
            let mut offset = 0;
            let views: Vec<SeqView<'_>> = full
                .iter()
                .map(|f| {
                    offset += f.2;
                    SeqView {
                        blocks: f.0,
                        pos: f.1,
                        offset: offset - f.2,
                        len: f.2,
                    }
                })
                .collect();
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            for (f, view) in full.iter().zip(&views) {
                let want = reference(&f.3, &f.4, &f.5, f.1)?;
                let diff = (got.narrow(0, view.offset, view.len)? - want)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?;
                assert!(diff < tol, "{dtype:?} d={d}: max diff {diff}");
            }
        }
        Ok(())
    }

    #[test]
    fn pool_grows_and_keeps_contents() -> Result<()> {
        let mut pool = KvPool::new(2, 1, 4, 1, DType::F16)?;
        let view = SeqView {
            blocks: &[0],
            pos: 3,
            offset: 0,
            len: 1,
        };
        pool.write(1, &view, &[1., 2., 3., 4.], &[5., 6., 7., 8.], 1);
        pool.grow(3)?;
        assert_eq!(pool.num_blocks(), 3);
        let mut out = vec![0f32; BLOCK_SIZE * 4];
        pool.read_block(1, true, 0, 0, &mut out);
        assert_eq!(&out[12..16], &[5., 6., 7., 8.]);
        assert_eq!(
            pool.size_in_bytes(),
            3 * KvPool::block_bytes(2, 1, 4, DType::F16)
        );
        Ok(())
    }

    #[test]
    fn strided_writes_land_in_every_format() {
        // 300 values: more than one 128-value conversion chunk of the f16 path.
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.25 - 30.0).collect();
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let mut store = Store::zeros(dtype, 5 + 300 * 3).unwrap();
            store.write_strided(5, &src, 3);
            let mut all = vec![0f32; 5 + 300 * 3];
            store.read(0, &mut all);
            for (i, &x) in src.iter().enumerate() {
                // Quarter steps below 64 in magnitude are exact in all three.
                assert_eq!(all[5 + 3 * i], x, "{dtype:?} value {i}");
                assert_eq!(all[6 + 3 * i], 0.0, "{dtype:?} gap after {i}");
            }
        }
    }

    /// The f16 cache attends exactly as an f32 cache holding the same
    /// f16-rounded values: decode and chunks, head_dim 64 and 8 (the scalar
    /// value path).
    #[test]
    fn f16_cache_equals_f32_cache_of_the_rounded_values() {
        let round = |x: Vec<f32>| -> Vec<f32> {
            x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        };
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 2_654_435_761usize) % 10_007) as f32 / 5_003.0 - 1.0)
                .collect()
        };
        for d in [64, 8] {
            let (nh, nkv) = (6, 2);
            let mut pools =
                [DType::F16, DType::F32].map(|dt| KvPool::new(1, nkv, d, 8, dt).unwrap());
            let blocks = [5u32, 1, 6, 3];
            // 37 tokens in three steps: a 20-row chunk, a 16-row chunk, one row.
            let mut pos = 0;
            for (step, len) in [20usize, 16, 1].into_iter().enumerate() {
                let tokens = vec![0u32; len];
                let seq = [crate::PagedSeq {
                    tokens: &tokens,
                    pos,
                    blocks: &blocks,
                    lora: None,
                }];
                let q = round(gen(nh * len * d, 3 * step));
                let k = round(gen(nkv * len * d, 3 * step + 1));
                let v = round(gen(nkv * len * d, 3 * step + 2));
                let [a, b] = &mut pools;
                let got = paged_attention_step(a, 0, nh, &seq, &q, &k, &v);
                let want = paged_attention_step(b, 0, nh, &seq, &q, &k, &v);
                assert_eq!(got, want, "d {d}, step {step}");
                pos += len;
            }
        }
    }
}
