//! Hearth's benchmarks.
//!
//! The library holds the pieces of `hearth-loadgen`, a streaming load
//! generator for any OpenAI-compatible server:
//! - [`sse`] splits a `text/event-stream` body into `data:` payloads and
//!   reads what each chunk carries (content, usage, errors);
//! - [`stats`] holds the percentile and mean maths of the summary;
//! - [`prompt`] builds the varied-word prompts;
//! - [`client`] sends one streamed request over plain HTTP/1.1;
//! - [`run`] drives many of them concurrently and sums them up.
//!
//! The criterion benches (`benches/engine.rs`, `benches/encoder.rs`) measure
//! the engine and the embedding encoder in-process; see `README.md`.

pub mod client;
pub mod prompt;
pub mod run;
pub mod sse;
pub mod stats;

pub use run::{run, Endpoint, LoadConfig, RequestResult, Summary, Target};
