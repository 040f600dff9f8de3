//! Quantized matmul speed on SmolLM2-135M's shapes: hearth's [`Linear`]
//! (`hearth-kernels` on the CPU) against candle's `QMatMul`, per format and
//! activation row count.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p hearth-models --example
//! qmatmul_speed`. Prints the best of many short runs as GFLOP/s (`2 m n
//! k`); the two are measured in alternation so that load from other
//! processes hits both alike.

use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Result, Tensor};
use hearth_models::Linear;

fn best_of(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < Duration::from_millis(10) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    Ok(best)
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    println!("rayon threads: {}", rayon::current_num_threads());
    let cases = [
        (GgmlDType::Q4_1, 1536, 576),
        (GgmlDType::Q4_0, 1536, 576),
        (GgmlDType::Q8_0, 1536, 576),
        (GgmlDType::Q4K, 576, 1536),
        (GgmlDType::Q6K, 576, 1536),
    ];
    for (dtype, n, k) in cases {
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let q = QTensor::quantize(&w, dtype)?;
        let ours = Linear::from_qtensor(QTensor::quantize(&w, dtype)?)?;
        let candle = QMatMul::from_qtensor(q)?;
        for m in [1usize, 16, 64] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let flops = 2.0 * (m * n * k) as f64 / 1e9;
            let (mut t_ours, mut t_candle) = (f64::MAX, f64::MAX);
            for _ in 0..20 {
                t_ours = t_ours.min(best_of(|| ours.forward(&x).map(|_| ()))?);
                t_candle = t_candle.min(best_of(|| candle.forward(&x).map(|_| ()))?);
            }
            println!(
                "{dtype:?} n={n} k={k} M={m:>2}: hearth {:6.1} GFLOP/s ({:7.1} us), candle QMatMul {:6.1} GFLOP/s ({:7.1} us)",
                flops / t_ours,
                t_ours * 1e6,
                flops / t_candle,
                t_candle * 1e6
            );
        }
    }
    Ok(())
}
