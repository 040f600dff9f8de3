//! Hand-offs of GPU tensors between threads.
//!
//! candle's CUDA device issues work on CUDA's per-thread default stream:
//! what one thread queues is ordered with that thread's later work only,
//! not with another thread's. A model is loaded (its weights uploaded) on
//! one thread and run on another (the engine's), and an adapter may be
//! prepared on a third, so every such hand-off waits here for all the
//! context's queued work first; and a model's forward pass runs entirely on
//! the thread that reads its result (see `Llama::run_paged`).

use candle_core::{Device, Result};

/// Waits until all work queued on `device` by any thread has finished (a
/// no-op on the CPU).
pub fn settle(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        return cuda
            .cuda_stream()
            .context()
            .synchronize()
            .map_err(candle_core::Error::wrap);
    }
    if device.is_cpu() {
        return Ok(());
    }
    device.synchronize()
}
