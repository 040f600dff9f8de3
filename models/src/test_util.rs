//! Helpers for the crate's unit tests.

use candle_core::{DType, Device, Result, Tensor};

/// Largest absolute difference of two tensors of any float dtype.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?;
    d.flatten_all()?.max(0)?.to_scalar::<f32>()
}

/// A seeded `[rows, cols]` f32 tensor, uniform on [-2, 2) (xorshift).
pub(crate) fn random(shape: (usize, usize), seed: u64, dev: &Device) -> Result<Tensor> {
    let mut state = seed | 1;
    let n = shape.0 * shape.1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, shape, dev)
}

/// The first CUDA device, or `None` after printing why the calling GPU
/// test is skipped (a machine without one).
#[cfg(feature = "cuda")]
pub(crate) fn test_cuda() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}
