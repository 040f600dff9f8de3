//! Hearth's CPU quantized matmuls are as exact as rounding the activations
//! to 8 bits per 32 values allows, and no less: their RMS error against the
//! f64 product of the dequantized weights is that rounding's expected error
//! (`common::quant_error`), within sampling noise, for every format and
//! row count the GPU test (`gpu.rs`) compares candle's CUDA kernels on.

mod common;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{Device, Module, Result, Tensor};
use common::quant_error::{exact, rms_error, rounding_rms, weight, CASES, ROWS};
use hearth_models::Linear;

#[test]
fn cpu_quantized_matmul_error_is_the_activation_rounding() -> Result<()> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for (dtype, n, k) in CASES {
        let (q, deq) = weight(&mut state, dtype, n, k)?;
        let storage = QStorage::from_data(q.data()?, &Device::Cpu, dtype)?;
        let linear = Linear::from_qtensor(QTensor::new(storage, (n, k))?)?;
        assert!(linear.is_quantized());
        for rows in ROWS {
            let x = common::seeded_uniform(&mut state, rows * k, 0.0, 1.0);
            let want = exact(&x, &deq, rows, n, k);
            let theory = rounding_rms(&x, &deq, rows, n, k);
            let xt = Tensor::from_vec(x, (rows, k), &Device::Cpu)?;
            let got = linear.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?;
            let e = rms_error(&got, &want);
            // Thousands of outputs: the sample RMS is within a few percent
            // of the expected one. Activations kept in f32 would give
            // ~1e-7; a wrong scale, block or row, errors of order 1.
            assert!(
                (0.85 * theory..1.15 * theory).contains(&e),
                "{dtype:?} {n}x{k}, {rows} rows: RMS error {e:.2e}, rounding alone {theory:.2e}"
            );
        }
    }
    Ok(())
}
