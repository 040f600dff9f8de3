//! The LoRA trainer's parts: `base` (frozen weights), `ops` (differentiable
//! primitives), `model` (forward and batch layout), `data` (tokens and loss
//! masks), `optim` (AdamW, schedule, clipping, RNG), `trainer` ([`Trainer`]).

pub(crate) mod base;
pub mod data;
pub(crate) mod model;
pub mod ops;
pub mod optim;
mod state;
pub mod trainer;

#[cfg(test)]
mod tests;

pub use base::Dims;
pub use optim::{clip_grad_norm, learning_rate, AdamW};
pub use trainer::Trainer;
