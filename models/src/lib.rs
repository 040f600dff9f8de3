//! Model architectures of Hearth, written on plain candle ops.
//!
//! The boundary with the engine is the small [`CausalLM`] trait: the engine
//! owns a [`KvPool`] of 16-token blocks and hands the model each step's
//! sequences as [`PagedSeq`]s (new tokens, position, block table) through
//! [`CausalLM::forward_paged`] (one flattened pass, logits `[batch,
//! vocab]`); [`CausalLM::forward`] runs one sequence over its own growable
//! [`KvCache`]. The model holds only weights and constant tables (RoPE),
//! never per-sequence state or block ownership.
//!
//! Architectures:
//! - [`Llama`] (`llama.rs`): loaded from a llama GGUF file (quantized matrices
//!   through hearth-kernels on the CPU for Q4_0/Q4_1/Q5_x/Q8_0/Q4_K/Q5_K/Q6_K, candle's
//!   `QMatMul` otherwise; see `gguf.rs` and `linear.rs`) or from Hugging Face safetensors + `config.json`
//!   ([`LlamaConfig`]).
//!
//! - [`Bert`] (`bert.rs`): a BERT encoder over packed (unpadded) batches,
//!   [`pool`]ing into sentence vectors, and [`CrossEncoder`] (the
//!   sequence-classification head) for reranking; RoBERTa and XLM-R
//!   (`roberta.rs`) are the same encoder with their own positions and
//!   names; configs through [`EncoderConfig`] (`encoder.rs`), tagged on
//!   `model_type`.
//!
//! - [`lora`]: LoRA adapters ([`LoraAdapter`]) in PEFT's files, with the q/k
//!   row permutation between Hugging Face and GGUF layouts; `lora_apply.rs`
//!   applies them per sequence inside a paged batch ([`PagedSeq::lora`],
//!   checked and prepared through [`LoraSpec`]), row by row on the CPU
//!   (`lora_rows.rs`; several rows at a time on AVX-512 tiles,
//!   `lora_tiles.rs`).
//!
//! - [`diffusion`]: Stable Diffusion text-to-image ([`diffusion::DiffusionPipeline`])
//!   from a diffusers folder, on candle-transformers' CLIP, UNet, VAE and
//!   schedulers; [`diffusion::write_tiny_pipeline`] writes a tiny one for tests.
//!
//! Other files: `paged/` ([`KvPool`] and the paged attention op),
//! `kv_cache.rs` ([`KvCache`]), `linear.rs` ([`Linear`]), `rotary.rs` (RoPE
//! tables).

mod bert;
mod bert_cpu;
#[cfg(feature = "cuda")]
mod cuda_table;
mod device_sync;
pub mod diffusion;
mod encoder;
mod gguf;
mod kv_cache;
mod layer_ops;
mod linear;
mod linear_fused;
mod llama;
mod llama_config;
mod llama_cpu;
mod llama_layers;
pub mod lora;
mod lora_apply;
mod lora_merge;
mod lora_rows;
#[cfg(target_arch = "x86_64")]
mod lora_tiles;
mod packed_attention;
mod paged;
mod pick;
mod roberta;
mod rotary;
#[cfg(test)]
mod test_util;
mod token_embedding;
pub mod vecmath;

pub use bert::{l2_normalize, pool, Bert, BertConfig, CrossEncoder, EncoderInput, Pooling};
pub use bert_cpu::EncoderPrecision;
pub use candle_core::quantized::gguf_file;
pub use candle_core::{DType, Device, Tensor};
pub use device_sync::settle;
pub use encoder::EncoderConfig;
pub use gguf::lora_spec_from_gguf;
pub use kv_cache::KvCache;
pub use layer_ops::round_q8;
pub use linear::{cuda_rounds_activations, kernel_format, Linear};
pub use llama::Llama;
pub use llama_config::{LlamaConfig, RopeScaling};
pub use lora::{LoraAdapter, LoraConfig, LoraTarget, LoraWeights};
pub use lora_apply::LoraSpec;
pub use paged::{paged_attention_step, KvPool, BLOCK_SIZE};
pub use pick::{pick_tokens, Pick};

/// A decoder-only language model.
///
/// Two ways to run it: [`CausalLM::forward`] for one sequence over its own
/// growable [`KvCache`], and [`CausalLM::forward_paged`] for many sequences
/// at once over a shared [`KvPool`], each through its own block table (the
/// engine's path). Both run the same code.
pub trait CausalLM: Send + Sync {
    /// Runs `tokens` at positions cache.len() .. cache.len()+tokens.len(),
    /// appends their keys/values to `cache`, and returns the f32 logits of the
    /// LAST token only, shape [vocab_size], on the model's device.
    ///
    /// Errors (and leaves `cache.len()` unchanged) when `tokens` is empty, a
    /// token id is `>= vocab_size`, or the sequence would grow past
    /// `context_length`.
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> candle_core::Result<Tensor>;

    /// Runs every sequence's new tokens in ONE pass, flattened with no
    /// padding (each linear layer sees all tokens of all sequences as one
    /// matrix), and returns the f32 logits of each sequence's last new token,
    /// shape `[batch, vocab]`, in input order. Sequence `i`'s tokens go at
    /// positions `seqs[i].pos..`; their keys and values are written to
    /// `pool` in the blocks of `seqs[i].blocks`, and attention reads
    /// positions `0..pos` from the same blocks.
    ///
    /// Errors, before anything runs, when `seqs` is empty, a chunk is empty,
    /// a token id is `>= vocab_size`, a sequence would pass
    /// `context_length`, a block table is too short or names a block outside
    /// the pool, or the pool does not match the model.
    fn forward_paged(
        &self,
        seqs: &[PagedSeq<'_>],
        pool: &mut KvPool,
    ) -> candle_core::Result<Tensor>;

    /// Static facts about the model (sizes, context length).
    fn info(&self) -> &ModelInfo;

    /// An empty single-sequence cache (buffers grow on demand).
    fn new_cache(&self) -> KvCache;

    /// A shared pool of `num_blocks` blocks of [`BLOCK_SIZE`] tokens.
    fn new_pool(&self, num_blocks: usize) -> candle_core::Result<KvPool>;

    /// Storage dtype of the KV cache.
    fn kv_dtype(&self) -> DType;

    /// The device the model's weights (and its KV pools) live on.
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// What a LoRA adapter must fit to run on this model
    /// ([`LoraSpec::prepare`]); `None` when the model takes no adapters.
    fn lora_spec(&self) -> Option<LoraSpec> {
        None
    }

    /// Folds `adapter` (prepared by [`LoraSpec::prepare`]) into the
    /// weights; refused by models that take no adapters.
    fn merge_lora(&mut self, _adapter: &LoraAdapter) -> candle_core::Result<()> {
        candle_core::bail!("this model cannot merge LoRA adapters")
    }

    /// Bytes of KV cache one block takes over all layers.
    fn block_bytes(&self) -> usize {
        let i = self.info();
        KvPool::block_bytes(i.num_layers, i.num_kv_heads, i.head_dim, self.kv_dtype())
    }
}

/// One sequence's part of a paged batch ([`CausalLM::forward_paged`]): new
/// `tokens` at positions `pos..pos + tokens.len()`, with every position's
/// key/value in block `blocks[position / BLOCK_SIZE]` of the pool, run with
/// the LoRA adapter `lora` if any (prepared by [`LoraSpec::prepare`]).
/// Sequences given the same adapter (the same reference) share its matmuls.
#[derive(Debug, Clone, Copy)]
pub struct PagedSeq<'a> {
    pub tokens: &'a [u32],
    pub pos: usize,
    pub blocks: &'a [u32],
    pub lora: Option<&'a LoraAdapter>,
}

impl<'a> PagedSeq<'a> {
    /// A sequence run on the base model (no adapter).
    pub fn new(tokens: &'a [u32], pos: usize, blocks: &'a [u32]) -> Self {
        Self {
            tokens,
            pos,
            blocks,
            lora: None,
        }
    }
}

/// Checks every sequence of a paged batch against the model and the pool
/// before anything runs (see [`CausalLM::forward_paged`]).
pub fn validate_paged(
    info: &ModelInfo,
    seqs: &[PagedSeq<'_>],
    pool: &KvPool,
) -> candle_core::Result<()> {
    if seqs.is_empty() {
        candle_core::bail!("forward_paged called with no sequences")
    }
    if pool.num_layers() != info.num_layers
        || pool.num_kv_heads() != info.num_kv_heads
        || pool.head_dim() != info.head_dim
    {
        candle_core::bail!(
            "kv pool of {} layers x {} heads x {} does not match the model",
            pool.num_layers(),
            pool.num_kv_heads(),
            pool.head_dim()
        )
    }
    for (i, s) in seqs.iter().enumerate() {
        if s.tokens.is_empty() {
            candle_core::bail!("sequence {i} of the batch has no tokens")
        }
        if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= info.vocab_size) {
            candle_core::bail!(
                "sequence {i}: token id {bad} out of range for vocabulary of {}",
                info.vocab_size
            )
        }
        let total = s.pos + s.tokens.len();
        if total > info.context_length {
            candle_core::bail!(
                "sequence {i}: {total} tokens exceed the context length {}",
                info.context_length
            )
        }
        if s.blocks.len() * BLOCK_SIZE < total {
            candle_core::bail!(
                "sequence {i}: {} blocks cannot hold {total} tokens",
                s.blocks.len()
            )
        }
        if let Some(a) = s.lora {
            if a.num_layers() != info.num_layers {
                candle_core::bail!(
                    "sequence {i}: adapter of {} layers on a model of {}",
                    a.num_layers(),
                    info.num_layers
                )
            }
        }
        if let Some(&bad) = s.blocks.iter().find(|&&b| b as usize >= pool.num_blocks()) {
            candle_core::bail!(
                "sequence {i}: block {bad} outside the pool of {}",
                pool.num_blocks()
            )
        }
    }
    Ok(())
}

/// Static description of a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Architecture name, e.g. `"llama"`.
    pub architecture: String,
    pub vocab_size: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub context_length: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}
