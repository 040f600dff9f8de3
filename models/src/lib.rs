//! Model architectures of Hearth, written on plain candle ops.
//!
//! The boundary with the engine is the small [`CausalLM`] trait: the engine
//! owns one [`KvCache`] per sequence and hands it to [`CausalLM::forward`]
//! together with the new tokens; the model holds only weights and constant
//! tables (RoPE), never per-sequence state.
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
mod q4_1;
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

    /// Static facts about the model (sizes, context length).
    fn info(&self) -> &ModelInfo;

    /// An empty cache sized for this model (buffers grow on demand).
    fn new_cache(&self) -> KvCache;
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
