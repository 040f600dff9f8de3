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
//! [`synth_gguf`] writes random-weight GGUF files shaped like Llama-3.2-1B
//! and Llama-3.1-8B (the `hearth-synth-gguf` tool) for measurements at the
//! sizes people run; [`synth_lora`] writes random LoRA adapters and a
//! catalogue naming them (the `hearth-synth-lora` tool) for measurements of
//! adapter serving.
//!
//! The criterion benches (`benches/engine.rs`, `benches/encoder.rs`) measure
//! the engine and the embedding encoder in-process; see `README.md`.

pub mod client;
pub mod prompt;
pub mod run;
pub mod sse;
pub mod stats;
pub mod synth_gguf;
pub mod synth_lora;

pub use run::{run, Endpoint, LoadConfig, RequestResult, Summary, Target};

/// Sets `RAYON_NUM_THREADS` to the machine's parallelism when unset, as the
/// `hearth` binary does at start: candle 0.11 asks for its thread count on
/// every matmul and, without the variable, parses `/proc/cpuinfo` each time
/// (a seventh of an engine step with a tiny model). Call it first in a
/// bench, before anything starts rayon's pool.
pub fn pin_rayon_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
}
