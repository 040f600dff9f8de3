//! How far a quantized matmul is from the exact product of its
//! dequantized weights, and how far rounding the activations to 8 bits
//! per 32 values (as Q8_0 and Q8_1 do, on the CPU's kernels and candle's
//! CUDA ones alike) should put it.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Result, Tensor};

/// The default model's Q4_1 and Q8_0 (576 x 1536 and back, its FFN
/// shapes) and two K-quants: `(dtype, n, k)`.
pub const CASES: [(GgmlDType, usize, usize); 5] = [
    (GgmlDType::Q4_1, 1536, 576),
    (GgmlDType::Q4_1, 576, 1536),
    (GgmlDType::Q8_0, 1536, 576),
    (GgmlDType::Q4K, 576, 1536),
    (GgmlDType::Q6K, 576, 1536),
];

/// Row counts that pick different GPU kernels (vector up to 8, matrix above).
pub const ROWS: [usize; 4] = [1, 7, 16, 64];

/// A random `[n, k]` weight quantized to `dtype` (weights of standard
/// deviation `1 / sqrt(k)`), and its dequantized values.
pub fn weight(
    state: &mut u64,
    dtype: GgmlDType,
    n: usize,
    k: usize,
) -> Result<(QTensor, Vec<f32>)> {
    let w = super::seeded_uniform(state, n * k, 0.0, 1.0 / (k as f32).sqrt());
    let q = QTensor::quantize(&Tensor::from_vec(w, (n, k), &Device::Cpu)?, dtype)?;
    let deq = q
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok((q, deq))
}

/// The f64 products of `rows` rows of `x` with the dequantized weight.
pub fn exact(x: &[f32], deq: &[f32], rows: usize, n: usize, k: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|r| {
            (0..n).map(move |i| {
                (0..k)
                    .map(|j| deq[i * k + j] as f64 * x[r * k + j] as f64)
                    .sum::<f64>()
            })
        })
        .collect()
}

/// Root-mean-square difference of `got` from the f64 `exact`.
pub fn rms_error(got: &[f32], exact: &[f64]) -> f64 {
    let sum: f64 = got
        .iter()
        .zip(exact)
        .map(|(&g, &e)| (g as f64 - e).powi(2))
        .sum();
    (sum / exact.len() as f64).sqrt()
}

/// The RMS error that rounding the activations to 8 bits per 32 values
/// (scale `amax / 127`) puts into `x · wᵀ`: each value's rounding error is
/// uniform on `±d / 2`, so output `i` of row `r` has variance
/// `Σ_j w_ij² d_rj² / 12`.
pub fn rounding_rms(x: &[f32], deq: &[f32], rows: usize, n: usize, k: usize) -> f64 {
    let mut total = 0.0;
    for r in 0..rows {
        let x = &x[r * k..(r + 1) * k];
        let d2: Vec<f64> = x
            .chunks(32)
            .map(|b| {
                let d = b.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                d * d / 12.0
            })
            .collect();
        for i in 0..n {
            let w = &deq[i * k..(i + 1) * k];
            total += w
                .iter()
                .enumerate()
                .map(|(j, &w)| (w as f64).powi(2) * d2[j / 32])
                .sum::<f64>();
        }
    }
    (total / (rows * n) as f64).sqrt()
}
