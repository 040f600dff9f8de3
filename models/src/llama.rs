//! Llama-architecture causal language model on plain candle ops.
//!
//! Covers Llama 2/3, SmolLM, TinyLlama and other checkpoints with the same
//! shape: token embedding, `N` pre-norm blocks of grouped-query attention with
//! rotary positions and a SwiGLU MLP, final RMSNorm and an output head that
//! may be tied to the embedding.
//! Reference: <https://github.com/huggingface/transformers/blob/main/src/transformers/models/llama/modeling_llama.py>
//!
//! Loading: [`Llama::from_safetensors`] here (Hugging Face names and
//! [`LlamaConfig`]), [`Llama::from_gguf`] in `gguf.rs`.
//!
//! The forward pass runs the chunks of one or more sequences flattened into
//! one `[tokens, hidden]` f32 matrix with no padding: embeddings, norms and
//! every linear layer see all rows at once (one matmul per weight, so a
//! quantized block is unpacked once for many rows); RoPE rotates each token
//! at its own position, taken from its sequence's [`KvCache`]; attention runs
//! per sequence over its own cache, with a causal mask inside its chunk; the
//! output head sees only each sequence's last token. `forward` is the batch
//! of one. The cache stores keys and
//! values in f16 by default ([`Llama::with_kv_dtype`]); attention math is f32. Attention reads the cached
//! keys/values as views without repeating them for grouped-query attention:
//! the query heads that share a KV head are stacked into the rows of one
//! matmul.
//!
//! On the CPU, when every linear layer of the blocks is a `hearth-kernels`
//! matrix (GGUF Q4_0/Q4_1/Q5_x/Q8_0), the blocks run on plain f32 slices
//! instead (`llama_cpu.rs`, same arithmetic); [`Llama::candle_ops_only`]
//! turns that off for comparisons.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::kv_cache::KvCache;
use crate::layer_ops;
use crate::linear::Linear;
use crate::llama_config::LlamaConfig;
use crate::llama_cpu::CpuBlocks;
use crate::llama_layers::{fuse_projections, Attention, Block, Mlp, RmsNorm};
use crate::lora::LoraTarget;
use crate::lora_apply::{LoraBatch, LoraSpec};
use crate::paged::{paged_attention, AttnShape, KvPool, SeqView, StepPlan};
use crate::rotary::{RopeLayout, RopeRows, Rotary};
use crate::token_embedding::TokenEmbedding;
use crate::{validate_paged, CausalLM, ModelInfo, PagedSeq};

/// A Llama model: weights and RoPE tables only; sequences live in [`KvCache`].
pub struct Llama {
    info: ModelInfo,
    /// `[vocab, hidden]`; looked-up rows are f32.
    embed: TokenEmbedding,
    pub(crate) blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: Rotary,
    device: Device,
    /// The blocks on plain slices (CPU, kernel matrices only; `None`
    /// otherwise or after [`Llama::candle_ops_only`]).
    cpu_blocks: Option<CpuBlocks>,
    /// Storage dtype of caches made by `new_cache` (f16 unless changed).
    kv_dtype: DType,
    /// Whether `new_cache`/`new_pool` keep keys and values as tensors on
    /// the model's device (`paged/tensors.rs`): always off the CPU; on the
    /// CPU only after [`Llama::with_tensor_kv`].
    tensor_kv: bool,
    /// Whether the tensor path runs its small steps as single ops
    /// (`layer_ops.rs`: CPU and CUDA) rather than candle's operations.
    layer_ops: bool,
}

impl Llama {
    /// Assembles a model from loaded parts (used by both loaders).
    pub(crate) fn from_parts(
        info: ModelInfo,
        embed: TokenEmbedding,
        blocks: Vec<Block>,
        norm: RmsNorm,
        lm_head: Linear,
        rotary: Rotary,
    ) -> Result<Self> {
        let i = &info;
        if i.num_heads == 0 || i.num_kv_heads == 0 || !i.num_heads.is_multiple_of(i.num_kv_heads) {
            candle_core::bail!(
                "{} query heads do not group over {} kv heads",
                i.num_heads,
                i.num_kv_heads
            )
        }
        if !i.head_dim.is_multiple_of(2) {
            candle_core::bail!("odd head_dim {}", i.head_dim)
        }
        if blocks.len() != i.num_layers {
            candle_core::bail!("{} blocks for {} layers", blocks.len(), i.num_layers)
        }
        if embed.dims()? != (i.vocab_size, i.hidden_size) {
            candle_core::bail!(
                "token embedding {:?} is not [{}, {}]",
                embed.dims()?,
                i.vocab_size,
                i.hidden_size
            )
        }
        if lm_head.out_features() != i.vocab_size || lm_head.in_features() != i.hidden_size {
            candle_core::bail!(
                "output head is {}x{}",
                lm_head.out_features(),
                lm_head.in_features()
            )
        }
        let device = embed.device();
        let mut blocks = blocks;
        if !device.is_cpu() {
            fuse_projections(&mut blocks)?;
        }
        // The weights were uploaded by this thread; the model runs on others.
        crate::settle(&device)?;
        let cpu_blocks = if device.is_cpu() {
            CpuBlocks::new(&blocks, &rotary, i.num_heads, i.num_kv_heads, i.head_dim)?
        } else {
            None
        };
        Ok(Self {
            info,
            embed,
            blocks,
            norm,
            lm_head,
            rotary,
            tensor_kv: !device.is_cpu(),
            layer_ops: crate::layer_ops::supported(&device),
            device,
            cpu_blocks,
            kv_dtype: DType::F16,
        })
    }

    /// Rebuilds the slice path's view of the blocks after their weights
    /// changed ([`Llama::merge_lora`]).
    pub(crate) fn rebuild_cpu_blocks(&mut self) -> Result<()> {
        if self.cpu_blocks.is_some() {
            let i = &self.info;
            self.cpu_blocks = CpuBlocks::new(
                &self.blocks,
                &self.rotary,
                i.num_heads,
                i.num_kv_heads,
                i.head_dim,
            )?;
        }
        Ok(())
    }

    /// Runs every block through candle operations, as on other devices and
    /// for sequences with a LoRA adapter, instead of the slice path of CPU
    /// models with kernel matrices (`llama_cpu.rs`); for comparisons.
    pub fn candle_ops_only(mut self) -> Self {
        self.cpu_blocks = None;
        self
    }

    /// Keeps the KV cache as candle tensors on the model's device and runs
    /// attention through candle operations, as on a GPU; on the CPU, for
    /// comparing that path with the CPU op (it also turns the slice path
    /// off, which needs the CPU pool).
    pub fn with_tensor_kv(mut self) -> Self {
        self.tensor_kv = true;
        self.cpu_blocks = None;
        self
    }

    /// Runs the tensor path's norms, residual sums, SwiGLU, RoPE and KV
    /// writes through candle's operations (as on Metal) instead of the
    /// single ops of `layer_ops.rs`; for comparisons.
    pub fn without_layer_ops(mut self) -> Self {
        self.layer_ops = false;
        self
    }

    /// Joins the projections again after their weights changed
    /// ([`Llama::merge_lora`]), where loading joined them.
    pub(crate) fn rejoin_projections(&mut self) -> Result<()> {
        if self.device.is_cpu() {
            return Ok(());
        }
        fuse_projections(&mut self.blocks)
    }

    /// Joins each block's q/k/v and gate/up weights where their formats
    /// allow, as on a GPU (where loading does it); on the CPU, for
    /// comparisons on the tensor path (the slice path keeps its own).
    pub fn fuse_projections(&mut self) -> Result<()> {
        fuse_projections(&mut self.blocks)
    }

    /// Whether the blocks run on the slice path (a CPU model whose linear
    /// layers are all `hearth-kernels` matrices without bias).
    pub fn runs_slice_path(&self) -> bool {
        self.cpu_blocks.is_some()
    }

    /// Sets the storage dtype of caches made by [`CausalLM::new_cache`]
    /// afterwards: f16 (the default) halves the cache memory and matches
    /// llama.cpp's default KV cache; f32 keeps attention exact in f32; bf16
    /// also works.
    /// f16, bf16 and f32 are supported; other dtypes are refused.
    pub fn with_kv_dtype(mut self, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
            candle_core::bail!("unsupported kv cache dtype {dtype:?}")
        }
        self.kv_dtype = dtype;
        Ok(self)
    }

    /// From Hugging Face safetensors + config.json (f32/f16/bf16 weights),
    /// names like `model.layers.0.self_attn.q_proj.weight`.
    ///
    /// Weights keep the `VarBuilder`'s dtype, except bf16 on CPU, which is
    /// widened to f32 (candle's CPU matmul has no bf16). Activations are f32,
    /// the KV cache f16 ([`Llama::with_kv_dtype`]). With a `VarMap`-backed builder, missing weights are
    /// created with random init (embeddings N(0,1), linears Kaiming normal,
    /// norms 1), which is how tests build tiny models.
    pub fn from_safetensors(config: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let cfg = config;
        if cfg.hidden_act != "silu" {
            candle_core::bail!("unsupported hidden_act {:?}", cfg.hidden_act)
        }
        let (h, d) = (cfg.hidden_size, cfg.head_dim());
        let (nh, nkv, ff) = (
            cfg.num_attention_heads,
            cfg.num_kv_heads(),
            cfg.intermediate_size,
        );
        let widen = vb.device().is_cpu() && vb.dtype() == DType::BF16;
        let get =
            |vb: &VarBuilder, shape: (usize, usize), name: &str, init: Init| -> Result<Tensor> {
                let w = vb.get_with_hints(shape, name, init)?;
                if widen {
                    w.to_dtype(DType::F32)
                } else {
                    Ok(w)
                }
            };
        let linear = |vb: &VarBuilder, out: usize, inp: usize, bias: bool| -> Result<Linear> {
            let lin = Linear::dense(get(
                vb,
                (out, inp),
                "weight",
                candle_nn::init::DEFAULT_KAIMING_NORMAL,
            )?)?;
            if bias {
                lin.with_bias(vb.get_with_hints(out, "bias", Init::Const(0.0))?)
            } else {
                Ok(lin)
            }
        };
        let norm = |vb: &VarBuilder| {
            RmsNorm::new(
                vb.get_with_hints(h, "weight", Init::Const(1.0))?,
                cfg.rms_norm_eps,
            )
        };

        let vm = vb.pp("model");
        let embed = get(
            &vm,
            (cfg.vocab_size, h),
            "embed_tokens.weight",
            Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let vl = vm.pp(format!("layers.{i}"));
            let (va, vf) = (vl.pp("self_attn"), vl.pp("mlp"));
            let ab = cfg.attention_bias;
            blocks.push(Block {
                attn_norm: norm(&vl.pp("input_layernorm"))?,
                attn: Attention {
                    q: linear(&va.pp("q_proj"), nh * d, h, ab)?,
                    k: linear(&va.pp("k_proj"), nkv * d, h, ab)?,
                    v: linear(&va.pp("v_proj"), nkv * d, h, ab)?,
                    o: linear(&va.pp("o_proj"), h, nh * d, ab)?,
                },
                ffn_norm: norm(&vl.pp("post_attention_layernorm"))?,
                mlp: Mlp {
                    gate: linear(&vf.pp("gate_proj"), ff, h, cfg.mlp_bias)?,
                    up: linear(&vf.pp("up_proj"), ff, h, cfg.mlp_bias)?,
                    down: linear(&vf.pp("down_proj"), h, ff, cfg.mlp_bias)?,
                },
            });
        }
        let final_norm = norm(&vm.pp("norm"))?;
        let lm_head = if cfg.tie_word_embeddings || !vb.contains_tensor("lm_head.weight") {
            Linear::dense(embed.clone())?
        } else {
            linear(&vb.pp("lm_head"), cfg.vocab_size, h, false)?
        };
        let rotary = Rotary::new(
            &cfg.inv_freq()?,
            cfg.max_position_embeddings,
            RopeLayout::Halves,
            vb.device(),
        )?;
        let info = ModelInfo {
            architecture: "llama".to_string(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.max_position_embeddings,
            num_layers: cfg.num_hidden_layers,
            hidden_size: h,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
        };
        let embed = TokenEmbedding::Dense(embed);
        Self::from_parts(info, embed, blocks, final_norm, lm_head, rotary)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Self-attention of block `layer` over `x` (`[tokens, hidden]`, normed),
    /// the flattened new tokens of every sequence of the batch: the q/k/v and
    /// output projections run once over all rows, RoPE once at every token's
    /// own position; the new keys/values go into `pool` at each sequence's
    /// positions and attention runs through the block tables.
    fn attention(
        &self,
        layer: usize,
        x: &Tensor,
        seqs: &[SeqView<'_>],
        pool: &mut KvPool,
        at: &StepRows,
        lora: &LoraBatch<'_>,
    ) -> Result<Tensor> {
        let positions = &at.positions;
        let a = &self.blocks[layer].attn;
        let proj =
            |lin: &Linear, t: LoraTarget, x: &Tensor| lora.apply(layer, t, x, lin.forward(x)?);
        let (nh, nkv, d) = (
            self.info.num_heads,
            self.info.num_kv_heads,
            self.info.head_dim,
        );
        let t = x.dim(0)?;
        let heads = |y: Tensor, n: usize| y.reshape((t, n, d))?.transpose(0, 1);
        if let (Some(kv), Some((rope, plan))) = (pool.tensors(), &at.tensor_kv) {
            // Token-major throughout: no transposed copies.
            let [q, k, v] = a.qkv(x)?;
            let q = lora.apply(layer, LoraTarget::Q, x, q)?; // [T, nh * d]
            let k = lora.apply(layer, LoraTarget::K, x, k)?; // [T, nkv * d]
            let v = lora.apply(layer, LoraTarget::V, x, v)?; // [T, nkv * d]
            let q = if self.layer_ops {
                // RoPE of the keys happens as they are written.
                let table = self.rotary.table(rope);
                kv.write_rows(layer, plan, &k, &v, table)?;
                layer_ops::rotate(&q, table, nh)?
            } else {
                let rope =
                    |y: Tensor, n: usize| self.rotary.apply_rows(&y.reshape((t, n, d))?, rope);
                let k = rope(k, nkv)?.reshape((t, nkv * d))?;
                kv.write(layer, plan, &k, &v)?;
                rope(q, nh)?
            }; // [T, nh, d]

            // Rounded by the attention's kernel where `o` would round it
            // (`Linear::rounds_input`).
            let (y, rounded) = kv.attend(layer, &q, plan, a.o.rounds_input())?;
            if rounded {
                crate::linear::mark_rounded(&y);
            }
            return proj(&a.o, LoraTarget::O, &y);
        }
        let flat = |y: Tensor| -> Result<Vec<f32>> { y.flatten_all()?.to_vec1::<f32>() };
        let q = flat(
            self.rotary
                .apply_at(&heads(proj(&a.q, LoraTarget::Q, x)?, nh)?, positions)?,
        )?; // [nh, T, d]
        let k = flat(
            self.rotary
                .apply_at(&heads(proj(&a.k, LoraTarget::K, x)?, nkv)?, positions)?,
        )?; // [nkv, T, d]
        let v = flat(heads(proj(&a.v, LoraTarget::V, x)?, nkv)?.contiguous()?)?;
        for s in seqs {
            pool.write(layer, s, &k, &v, t);
        }
        let shape = AttnShape {
            num_heads: nh,
            tokens: t,
        };
        let y = paged_attention(pool, layer, &q, shape, seqs);
        let y = Tensor::from_vec(y, (t, nh * d), &Device::Cpu)?.to_device(&self.device)?;
        proj(&a.o, LoraTarget::O, &y)
    }

    /// The flattened pass behind `forward` and `forward_paged`, on inputs
    /// already validated: logits `[batch, vocab]` of each sequence's last
    /// token.
    fn run_paged(&self, seqs: &[PagedSeq<'_>], pool: &mut KvPool) -> Result<Tensor> {
        if !self.device.is_cpu() {
            // On the GPU the whole pass stays on the calling thread: it
            // queues on that thread's stream, where the caller reads the
            // result (`device_sync.rs`).
            return self.run_paged_here(seqs, pool);
        }
        on_rayon_worker(|| self.run_paged_here(seqs, pool))
    }

    /// [`Llama::run_paged`] on the calling thread.
    fn run_paged_here(&self, seqs: &[PagedSeq<'_>], pool: &mut KvPool) -> Result<Tensor> {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut last_rows = Vec::with_capacity(seqs.len());
        let mut views = Vec::with_capacity(seqs.len());
        let mut offsets = Vec::with_capacity(seqs.len());
        for s in seqs {
            offsets.push(tokens.len());
            views.push(SeqView {
                blocks: s.blocks,
                pos: s.pos,
                offset: tokens.len(),
                len: s.tokens.len(),
            });
            tokens.extend_from_slice(s.tokens);
            positions.extend((s.pos..s.pos + s.tokens.len()).map(|p| p as u32));
            last_rows.push((tokens.len() - 1) as u32);
        }
        let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
        if max_pos >= self.rotary.max_len() {
            candle_core::bail!(
                "position {max_pos} past the RoPE table of {}",
                self.rotary.max_len()
            )
        }
        let mut x = self.embed.lookup(&tokens, &self.device)?;
        let lora = LoraBatch::new(seqs, &offsets, &self.device)?;
        match &self.cpu_blocks {
            Some(cpu) if pool.tensors().is_none() => {
                let mut rows = x.flatten_all()?.to_vec1::<f32>()?;
                cpu.run(&mut rows, &positions, &views, pool, &lora)?;
                x = Tensor::from_vec(rows, x.shape(), &self.device)?;
            }
            _ => x = self.run_blocks(x, &lora, &views, &positions, pool)?,
        }
        let last = if last_rows.len() == 1 {
            x.narrow(0, last_rows[0] as usize, 1)?
        } else {
            x.index_select(&Tensor::new(last_rows.as_slice(), &self.device)?, 0)?
        };
        self.lm_head
            .forward(&self.norm.forward(&last)?)?
            .to_dtype(DType::F32)
    }

    /// The blocks through candle operations: `x` is `[tokens, hidden]`.
    fn run_blocks(
        &self,
        mut x: Tensor,
        lora: &LoraBatch<'_>,
        views: &[SeqView<'_>],
        positions: &[u32],
        pool: &mut KvPool,
    ) -> Result<Tensor> {
        let positions = Tensor::new(positions, &self.device)?;
        let tensor_kv = match pool.tensors() {
            Some(kv) => Some((
                self.rotary.rows(&positions)?,
                kv.plan(views, self.info.num_heads)?,
            )),
            None => None,
        };
        let at = StepRows {
            positions,
            tensor_kv,
        };
        if self.layer_ops && at.tensor_kv.is_some() {
            return self.run_blocks_fused(x, lora, views, pool, &at);
        }
        for (i, block) in self.blocks.iter().enumerate() {
            let n = block.attn_norm.forward(&x)?;
            let h = self.attention(i, &n, views, pool, &at, lora)?;
            x = (x + h)?;
            let n = block.ffn_norm.forward(&x)?;
            let [g, u] = block.mlp.gate_up(i, &n, lora)?;
            let h = (candle_nn::ops::silu(&g)? * u)?;
            x = (x + block.mlp.down(i, &h, lora)?)?;
        }
        Ok(x)
    }
}

impl Llama {
    /// [`Llama::run_blocks`] on the tensor path with the single ops of
    /// `layer_ops.rs`: each block's residual sum is taken by the norm
    /// after it (the next block's, for the feed-forward's), and SwiGLU is
    /// one op.
    fn run_blocks_fused(
        &self,
        mut x: Tensor,
        lora: &LoraBatch<'_>,
        views: &[SeqView<'_>],
        pool: &mut KvPool,
        at: &StepRows,
    ) -> Result<Tensor> {
        // With `round`, the output is rounded in the op's kernel for the
        // quantized matmuls it feeds (`Linear::rounds_input`), which then
        // skip their own rounding launch.
        let marked = |t: Tensor, round: bool| {
            if round {
                crate::linear::mark_rounded(&t);
            }
            t
        };
        let norm = |x: &Tensor, h: Option<Tensor>, by: &RmsNorm, round: bool| -> Result<_> {
            match h {
                Some(h) => {
                    let (sum, n) = layer_ops::add_rms_norm(x, &h, &by.weight, by.eps, round)?;
                    Ok((sum, marked(n, round)))
                }
                None => Ok((x.clone(), by.forward(x)?)),
            }
        };
        let any_rounds = |ls: &[&Linear]| ls.iter().any(|l| l.rounds_input());
        let mut pending: Option<Tensor> = None;
        for (i, block) in self.blocks.iter().enumerate() {
            let (a, m) = (&block.attn, &block.mlp);
            let round = any_rounds(&[&a.q, &a.k, &a.v]);
            let (sum, n) = norm(&x, pending.take(), &block.attn_norm, round)?;
            let h = self.attention(i, &n, views, pool, at, lora)?;
            let round = any_rounds(&[&m.gate, &m.up]);
            let (sum, n) = norm(&sum, Some(h), &block.ffn_norm, round)?;
            x = sum;
            let [g, u] = m.gate_up(i, &n, lora)?;
            let round = m.down.rounds_input();
            let h = marked(layer_ops::swiglu(&g, &u, round)?, round);
            pending = Some(m.down(i, &h, lora)?);
        }
        match pending {
            Some(h) => x + h,
            None => Ok(x),
        }
    }
}

/// Where a step's rows go: each row's position (RoPE) and, with a tensor
/// KV pool, their RoPE rows and the pool's plan for the step (both built
/// once per step, used by every layer).
struct StepRows {
    positions: Tensor,
    tensor_kv: Option<(RopeRows, StepPlan)>,
}

/// Runs `f` on a rayon worker (the calling thread when it is one). A step
/// is a few hundred parallel operations of tens of microseconds; started
/// from a worker, each one's pieces go to the pool's queues and the caller
/// works on them too, where a caller outside the pool would sleep until the
/// pool finishes each operation and pay a thread wake-up every time.
fn on_rayon_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let mut out = None;
    rayon::scope(|_| out = Some(f()));
    out.expect("the scope ran its closure")
}

impl CausalLM for Llama {
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let info = &self.info;
        if cache.num_layers() != info.num_layers {
            candle_core::bail!(
                "kv cache has {} layers, model {}",
                cache.num_layers(),
                info.num_layers
            )
        }
        let pos = cache.len();
        if pos + tokens.len() > info.context_length {
            candle_core::bail!(
                "sequence of {} tokens exceeds the context length {}",
                pos + tokens.len(),
                info.context_length
            )
        }
        cache.reserve(tokens.len())?;
        let seqs = [PagedSeq::new(tokens, pos, &cache.blocks)];
        validate_paged(info, &seqs, &cache.pool)?;
        let logits = self.run_paged(&seqs, &mut cache.pool)?.squeeze(0)?;
        cache.advance(tokens.len());
        Ok(logits)
    }

    fn forward_paged(&self, seqs: &[PagedSeq<'_>], pool: &mut KvPool) -> Result<Tensor> {
        validate_paged(&self.info, seqs, pool)?;
        self.run_paged(seqs, pool)
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> KvCache {
        let i = &self.info;
        if self.tensor_kv {
            return KvCache::on_device(
                i.num_layers,
                i.num_kv_heads,
                i.head_dim,
                i.context_length,
                self.kv_dtype,
                &self.device,
            )
            .expect("an empty cache on the model's device");
        }
        KvCache::new(
            i.num_layers,
            i.num_kv_heads,
            i.head_dim,
            i.context_length,
            self.kv_dtype,
        )
        .expect("kv dtype checked by with_kv_dtype")
    }

    fn new_pool(&self, num_blocks: usize) -> Result<KvPool> {
        let i = &self.info;
        if self.tensor_kv {
            return KvPool::on_device(
                i.num_layers,
                i.num_kv_heads,
                i.head_dim,
                num_blocks,
                self.kv_dtype,
                &self.device,
            );
        }
        KvPool::new(
            i.num_layers,
            i.num_kv_heads,
            i.head_dim,
            num_blocks,
            self.kv_dtype,
        )
    }

    fn kv_dtype(&self) -> DType {
        self.kv_dtype
    }

    fn device(&self) -> Device {
        self.device.clone()
    }

    fn merge_lora(&mut self, adapter: &crate::LoraAdapter) -> Result<()> {
        Llama::merge_lora(self, adapter)
    }

    fn lora_spec(&self) -> Option<LoraSpec> {
        Some(LoraSpec {
            info: self.info.clone(),
            intermediate_size: self.blocks.first()?.mlp.gate.out_features(),
            gguf_layout: self.rotary.layout() == RopeLayout::Interleaved,
            device: self.device.clone(),
        })
    }
}
