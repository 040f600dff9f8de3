//! Hearth's inference engine.
//!
//! - [`catalog`] names the models Hearth knows and [`pull`] fetches them.
//! - [`tokenizer`] builds tokenizers (from GGUF metadata or `tokenizer.json`),
//!   [`chat_template`] renders chat prompts, [`detok`] turns token ids back into
//!   text incrementally and [`stop`] holds back text that may become a stop string.
//! - [`sampler`] picks the next token from logits.
//! - [`engine`] owns the model on its own OS thread; handlers talk to it through
//!   an [`EngineHandle`].

pub mod catalog;
pub mod chat_template;
pub mod detok;
pub mod engine;
pub mod pull;
pub mod sampler;
pub mod stop;
pub mod tokenizer;

pub use engine::{EngineConfig, EngineHandle, EngineParts, TokenStream};
pub mod load;
pub use candle_core::Device;
pub use load::ChatModel;
