//! Model architectures of Hearth, written on plain candle ops.
//!
//! The boundary with the engine is the small [`CausalLM`] trait: the engine
//! owns one [`KvCache`] per sequence and hands it to [`CausalLM::forward`]
//! together with the new tokens, or many sequences' chunks at once to
//! [`CausalLM::forward_batch`] as [`SeqStep`]s (one pass, logits
//! `[batch, vocab]`); the model holds only weights and constant tables
//! (RoPE), never per-sequence state.
//!
//! Architectures:
//! - [`Llama`] (`llama.rs`): loaded from a llama GGUF file (quantized matrices
//!   through candle's `QMatMul`, or `q4_1.rs` for Q4_1 on the CPU; see
//!   `gguf.rs`) or from Hugging Face safetensors + `config.json`
//!   ([`LlamaConfig`]).
//!
//! - [`Bert`] (`bert.rs`): a BERT encoder over packed (unpadded) batches,
//!   [`pool`]ing into sentence vectors, and [`BertCrossEncoder`] (the
//!   sequence-classification head) for reranking; configs through
//!   [`EncoderConfig`], tagged on `model_type`.
//!
//! Other files: `kv_cache.rs` ([`KvCache`]), `linear.rs` ([`Linear`]),
//! `rotary.rs` (RoPE tables).

mod bert;
mod gguf;
mod kv_cache;
mod linear;
mod llama;
mod rotary;

pub use bert::{
    l2_normalize, pool, Bert, BertConfig, BertCrossEncoder, EncoderConfig, EncoderInput, Pooling,
};
pub use candle_core::quantized::gguf_file;
pub use candle_core::{DType, Device, Tensor};
pub use kv_cache::KvCache;
pub use linear::Linear;
pub use llama::{Llama, LlamaConfig, RopeScaling};

/// A decoder-only language model that runs one sequence chunk at a time.
pub trait CausalLM: Send + Sync {
    /// Runs `tokens` at positions cache.len() .. cache.len()+tokens.len(),
    /// appends their keys/values to `cache`, and returns the f32 logits of the
    /// LAST token only, shape [vocab_size], on the model's device.
    ///
    /// Errors (and leaves `cache.len()` unchanged) when `tokens` is empty, a
    /// token id is `>= vocab_size`, or the sequence would grow past
    /// `context_length`.
    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> candle_core::Result<Tensor>;

    /// Runs every sequence's new tokens in ONE pass and returns the f32
    /// logits of each sequence's last new token, shape `[batch, vocab]`, in
    /// input order. Each step's tokens go at positions `cache.len()..` of its
    /// own cache, exactly as [`CausalLM::forward`] would run them alone.
    ///
    /// Errors when `steps` is empty or any step would fail in `forward`
    /// (empty tokens, a token id `>= vocab_size`, past `context_length`); the
    /// inputs are all checked first, and on error no cache's `len()` changes.
    ///
    /// The default runs `forward` once per step (after checking every step)
    /// and stacks the results; [`Llama`] overrides it with one flattened pass
    /// whose linear layers see all tokens of all sequences as one matrix.
    fn forward_batch(&self, steps: &mut [SeqStep<'_>]) -> candle_core::Result<Tensor> {
        validate_steps(self.info(), steps)?;
        let mut logits = Vec::with_capacity(steps.len());
        for (i, step) in steps.iter_mut().enumerate() {
            match self.forward(step.tokens, step.cache) {
                Ok(l) => logits.push(l),
                Err(e) => {
                    // Undo the sequences already advanced: their entries past
                    // the old length are stale and overwritten later.
                    for s in steps[..i].iter_mut() {
                        let len = s.cache.len() - s.tokens.len();
                        s.cache.truncate(len);
                    }
                    return Err(e);
                }
            }
        }
        Tensor::stack(&logits, 0)
    }

    /// Static facts about the model (sizes, context length).
    fn info(&self) -> &ModelInfo;

    /// An empty cache sized for this model (buffers grow on demand).
    fn new_cache(&self) -> KvCache;
}

/// One sequence's part of a batched step ([`CausalLM::forward_batch`]): new
/// `tokens` appended at positions `cache.len()..cache.len() + tokens.len()`
/// of the sequence's own `cache`.
pub struct SeqStep<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
}

/// Checks every step of a batch against the model's limits before anything
/// runs: a non-empty batch, non-empty chunks, token ids below `vocab_size`,
/// no sequence past `context_length`, caches with the model's layer count.
pub fn validate_steps(info: &ModelInfo, steps: &[SeqStep<'_>]) -> candle_core::Result<()> {
    if steps.is_empty() {
        candle_core::bail!("forward_batch called with no sequences")
    }
    for (i, s) in steps.iter().enumerate() {
        if s.tokens.is_empty() {
            candle_core::bail!("sequence {i} of the batch has no tokens")
        }
        if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= info.vocab_size) {
            candle_core::bail!(
                "sequence {i}: token id {bad} out of range for vocabulary of {}",
                info.vocab_size
            )
        }
        let total = s.cache.len() + s.tokens.len();
        if total > info.context_length {
            candle_core::bail!(
                "sequence {i}: {total} tokens exceed the context length {}",
                info.context_length
            )
        }
        if s.cache.num_layers() != info.num_layers {
            candle_core::bail!(
                "sequence {i}: kv cache has {} layers, model {}",
                s.cache.num_layers(),
                info.num_layers
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
