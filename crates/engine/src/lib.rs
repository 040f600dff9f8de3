//! Hearth's inference engine.
//!
//! - [`catalog`] names the models Hearth knows and [`pull`] fetches them.
//! - [`tokenizer`] builds tokenizers (from GGUF metadata or `tokenizer.json`),
//!   [`chat_template`] renders chat prompts, [`detok`] turns token ids back into
//!   text incrementally and [`stop`] holds back text that may become a stop string.
//! - [`sampler`] picks the next token from logits.
//! - [`engine`] owns the model on its own OS thread; handlers talk to it through
//!   an [`EngineHandle`]. Its loop (`engine_loop.rs`) schedules sequences
//!   (`sequence.rs`) with continuous batching over a paged KV pool whose
//!   blocks [`block_manager`] hands out, shares by prompt prefix and frees.
//! - [`adapters`] keeps the LoRA adapters of an engine (a bounded LRU loaded
//!   lazily by key); requests name theirs in `GenerateRequest::adapter`.
//! - [`image`] serves text-to-image diffusion models on a worker thread
//!   each, behind a bounded queue.
//! - [`embed`] loads sentence-transformers embedding models; [`batcher`] packs
//!   concurrent embedding requests into forward passes under a token budget
//!   on the encoder's own thread ([`EncoderHandle`]).

pub mod adapters;
pub mod batcher;
pub mod block_manager;
pub mod catalog;
pub mod chat_template;
pub mod cross_encoder;
pub mod detok;
pub mod device;
pub mod embed;
pub mod engine;
mod engine_loop;
pub mod grammar;
pub mod image;
pub mod pull;
pub mod sampler;
mod sequence;
mod step_cost;
pub mod stop;
mod threads;
pub mod tokenizer;

pub use adapters::{AdapterCache, AdapterLoader, LoadedAdapter, PeftFiles};
pub use batcher::{BatcherConfig, EncodeItem, EncoderHandle};
pub use device::DeviceSpec;
pub use embed::EmbedModel;
pub use engine::{
    default_kv_cache_bytes, EngineConfig, EngineHandle, EngineParts, EngineSnapshot, TokenStream,
};
pub use hearth_models::EncoderPrecision;
pub use hearth_models::{LoraAdapter, LoraSpec};
pub mod load;
pub use candle_core::Device;
pub use load::ChatModel;
