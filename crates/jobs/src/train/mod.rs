//! The LoRA trainer's parts: `base` (frozen weights), `ops` (differentiable
//! primitives), `model` (forward and batch layout), `data` (tokens and loss
//! masks), `optim` (AdamW, schedule, clipping, RNG), `trainer` ([`Trainer`]);
//! `step` (the hand-written forward and backward the trainer runs, on
//! `kernels`, `gemm` and the reused `buffers`), with `model` as its
//! autograd reference.

pub(crate) mod base;
mod buffers;
pub mod data;
mod gemm;
mod kernels;
pub(crate) mod model;
pub mod ops;
pub mod optim;
mod state;
mod step;
pub mod trainer;

#[cfg(test)]
mod step_tests;
#[cfg(test)]
mod tests;

pub use base::Dims;
pub use optim::{clip_grad_norm, learning_rate, AdamW};
pub use trainer::Trainer;
