//! The ops' CPU versions against candle's operations (what the tensor path
//! ran before them), on strided inputs; with the `cuda` feature and a GPU,
//! the kernels against the CPU versions.

use candle_core::{DType, Device, Result, Tensor};

use super::{add_rms_norm, rotate, swiglu, write_rows};
use crate::rotary::{inv_freq, RopeLayout, Rotary};
use crate::test_util::{max_diff, random};

/// Three column slices of one wide output, as a fused projection's would be.
fn slices(t: usize, widths: [usize; 3], seed: u64, dev: &Device) -> Result<[Tensor; 3]> {
    let all = random((t, widths.iter().sum()), seed, dev)?;
    let a = all.narrow(1, 0, widths[0])?;
    let b = all.narrow(1, widths[0], widths[1])?;
    let c = all.narrow(1, widths[0] + widths[1], widths[2])?;
    Ok([a, b, c])
}

#[test]
fn add_rms_norm_is_the_sum_and_candles_rms_norm() -> Result<()> {
    let dev = Device::Cpu;
    for t in [1, 5] {
        let [x, h, _] = slices(t, [96, 96, 8], 3, &dev)?;
        let w = random((1, 96), 7, &dev)?.flatten_all()?;
        let (sum, norm) = add_rms_norm(&x, &h, &w, 1e-5, false)?;
        let want_sum = (&x + &h)?;
        let want_norm = candle_nn::ops::rms_norm(&want_sum, &w, 1e-5)?;
        assert_eq!(max_diff(&sum, &want_sum)?, 0.0);
        assert!(
            max_diff(&norm, &want_norm)? < 1e-5,
            "{}",
            max_diff(&norm, &want_norm)?
        );
        assert!(norm.is_contiguous() && sum.is_contiguous());
    }
    // A wrong weight length is an error, not a read past the end.
    let [x, h, _] = slices(2, [96, 96, 8], 3, &dev)?;
    let short = Tensor::zeros(95, DType::F32, &dev)?;
    assert!(add_rms_norm(&x, &h, &short, 1e-5, false).is_err());
    Ok(())
}

#[test]
fn swiglu_is_silu_of_gate_times_up() -> Result<()> {
    let dev = Device::Cpu;
    for t in [1, 4] {
        let [g, u, _] = slices(t, [64, 64, 0], 11, &dev)?;
        let got = swiglu(&g, &u, false)?;
        let want = (candle_nn::ops::silu(&g.contiguous()?)? * &u)?;
        assert!(max_diff(&got, &want)? < 1e-6);
        assert_eq!(got.dims(), &[t, 64]);
    }
    Ok(())
}

fn rotary(layout: RopeLayout, d: usize, dev: &Device) -> Result<Rotary> {
    Rotary::new(&inv_freq(d, 10_000.0), 64, layout, dev)
}

#[test]
fn rotate_matches_apply_rows_in_both_layouts() -> Result<()> {
    let dev = Device::Cpu;
    let (t, heads, d) = (3, 4, 16);
    let positions = Tensor::new(&[5u32, 0, 63], &dev)?;
    for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
        let rot = rotary(layout, d, &dev)?;
        let rows = rot.rows(&positions)?;
        let [q, _, _] = slices(t, [heads * d, 2 * d, 2 * d], 5, &dev)?;
        let got = rotate(&q, rot.table(&rows), heads)?;
        let want = rot.apply_rows(&q.reshape((t, heads, d))?, &rows)?;
        assert_eq!(got.dims(), &[t, heads, d]);
        assert!(max_diff(&got, &want)? < 1e-6, "{layout:?}");
    }
    Ok(())
}

#[test]
fn write_rows_puts_rotated_keys_and_plain_values_in_their_pool_rows() -> Result<()> {
    let dev = Device::Cpu;
    let (t, heads, d) = (3, 2, 8);
    let width = heads * d;
    let rot = rotary(RopeLayout::Halves, d, &dev)?;
    let rows = rot.rows(&Tensor::new(&[1u32, 2, 9], &dev)?)?;
    let pool_rows = Tensor::new(&[7u32, 0, 12], &dev)?;
    let [_, k, v] = slices(t, [4, width, width], 9, &dev)?;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let keys = Tensor::zeros((16, width), dtype, &dev)?;
        let values = Tensor::zeros((16, width), dtype, &dev)?;
        write_rows(&keys, &k, &pool_rows, Some(rot.table(&rows)), heads)?;
        write_rows(&values, &v, &pool_rows, None, heads)?;
        let rotated = rot
            .apply_rows(&k.reshape((t, heads, d))?, &rows)?
            .reshape((t, width))?;
        for (i, r) in [7usize, 0, 12].into_iter().enumerate() {
            let want_k = rotated.get(i)?.to_dtype(dtype)?;
            let want_v = v.get(i)?.to_dtype(dtype)?;
            assert_eq!(
                max_diff(&keys.get(r)?, &want_k)?,
                0.0,
                "{dtype:?} key row {r}"
            );
            assert_eq!(
                max_diff(&values.get(r)?, &want_v)?,
                0.0,
                "{dtype:?} value row {r}"
            );
        }
        // Every other row is untouched.
        let written = keys.abs()?.sum(1)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let nonzero: Vec<usize> = (0..16).filter(|&r| written[r] != 0.0).collect();
        assert_eq!(nonzero, vec![0, 7, 12]);
    }
    // A pool row past the end is an error.
    let keys = Tensor::zeros((16, width), DType::F16, &dev)?;
    let bad = Tensor::new(&[7u32, 0, 16], &dev)?;
    assert!(write_rows(&keys, &k, &bad, None, heads).is_err());
    Ok(())
}

#[test]
fn round_q8_rounds_each_run_of_32_to_8_bits_and_is_idempotent() -> Result<()> {
    let x = random((3, 64), 13, &Device::Cpu)?;
    let r = super::round_q8(&x)?;
    let (xs, rs) = (
        x.flatten_all()?.to_vec1::<f32>()?,
        r.flatten_all()?.to_vec1::<f32>()?,
    );
    for (run, (xr, rr)) in xs.chunks(32).zip(rs.chunks(32)).enumerate() {
        let d = xr.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (a, b) in xr.iter().zip(rr) {
            let q = b / d;
            assert!(
                (q - q.round()).abs() < 1e-4,
                "run {run}: {b} is not a multiple of {d}"
            );
            assert!(
                (a - b).abs() <= d / 2.0 + 1e-6,
                "run {run}: {a} rounded to {b}"
            );
        }
    }
    // Rounded values round to themselves; a zero run stays zero.
    assert_eq!(max_diff(&super::round_q8(&r)?, &r)?, 0.0);
    let zeros = Tensor::zeros((1, 32), DType::F32, &Device::Cpu)?;
    assert_eq!(max_diff(&super::round_q8(&zeros)?, &zeros)?, 0.0);
    // Rows that are not whole runs are refused.
    assert!(super::round_q8(&random((2, 48), 1, &Device::Cpu)?).is_err());
    Ok(())
}

/// With `round`, the norm and SwiGLU give their plain outputs rounded as
/// `round_q8` rounds them (the sum untouched); rows that are not whole
/// runs of 32 are refused.
#[test]
fn rounding_layer_ops_give_round_q8_of_their_outputs() -> Result<()> {
    let dev = Device::Cpu;
    let [x, h, _] = slices(3, [96, 96, 8], 5, &dev)?;
    let w = random((1, 96), 9, &dev)?.flatten_all()?;
    let (sum, norm) = add_rms_norm(&x, &h, &w, 1e-5, false)?;
    let (sum_r, norm_r) = add_rms_norm(&x, &h, &w, 1e-5, true)?;
    assert_eq!(max_diff(&sum_r, &sum)?, 0.0);
    assert_eq!(max_diff(&norm_r, &super::round_q8(&norm)?)?, 0.0);
    assert!(max_diff(&norm_r, &norm)? > 0.0, "nothing was rounded");
    let [g, u, _] = slices(2, [64, 64, 0], 17, &dev)?;
    let plain = swiglu(&g, &u, false)?;
    let rounded = swiglu(&g, &u, true)?;
    assert_eq!(max_diff(&rounded, &super::round_q8(&plain)?)?, 0.0);
    assert!(max_diff(&rounded, &plain)? > 0.0, "nothing was rounded");
    let [x, h, _] = slices(2, [48, 48, 8], 5, &dev)?;
    let w = random((1, 48), 9, &dev)?.flatten_all()?;
    assert!(add_rms_norm(&x, &h, &w, 1e-5, true).is_err());
    assert!(swiglu(&x, &h, true).is_err());
    Ok(())
}

/// Each kernel against its CPU version, on strided inputs.
#[cfg(feature = "cuda")]
#[test]
fn cuda_layer_ops_match_the_cpu() -> Result<()> {
    let Some(gpu) = crate::test_util::test_cuda() else {
        return Ok(());
    };
    let cpu = Device::Cpu;
    let (t, heads, d) = (5, 4, 64);
    let width = heads * d;
    let on = |x: &Tensor| x.to_device(&gpu);
    let back = |x: &Tensor| x.to_device(&Device::Cpu);
    let [a, b, c] = slices(t, [width, width, width], 21, &cpu)?;
    let w = random((1, width), 4, &cpu)?.flatten_all()?;
    let all_gpu = on(&Tensor::cat(&[&a, &b, &c], 1)?)?;
    let (ga, gb) = (
        all_gpu.narrow(1, 0, width)?,
        all_gpu.narrow(1, width, width)?,
    );
    let gc = all_gpu.narrow(1, 2 * width, width)?;

    let (sum, norm) = add_rms_norm(&a, &b, &w, 1e-6, false)?;
    let (gsum, gnorm) = add_rms_norm(&ga, &gb, &on(&w)?, 1e-6, false)?;
    assert!(max_diff(&back(&gsum)?, &sum)? < 1e-6);
    assert!(max_diff(&back(&gnorm)?, &norm)? < 1e-5);
    // Rounded in the kernel: the GPU's own norm, rounded (the CPU's
    // rounding of the same values).
    let (_, gnorm_r) = add_rms_norm(&ga, &gb, &on(&w)?, 1e-6, true)?;
    let want = super::round_q8(&back(&gnorm)?)?;
    assert!(max_diff(&back(&gnorm_r)?, &want)? < 1e-6);

    let s = swiglu(&a, &c, false)?;
    let gs = swiglu(&ga, &gc, false)?;
    assert!(max_diff(&back(&gs)?, &s)? < 1e-5);
    let want = super::round_q8(&back(&gs)?)?;
    assert!(max_diff(&back(&swiglu(&ga, &gc, true)?)?, &want)? < 1e-6);

    let r = super::round_q8(&a)?;
    assert!(max_diff(&back(&super::round_q8(&ga)?)?, &r)? < 1e-6);

    let positions = [3u32, 17, 0, 40, 63];
    for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
        let (rc, rg) = (rotary(layout, d, &cpu)?, rotary(layout, d, &gpu)?);
        let (rows_c, rows_g) = (
            rc.rows(&Tensor::new(&positions, &cpu)?)?,
            rg.rows(&Tensor::new(&positions, &gpu)?)?,
        );
        let q = rotate(&a, rc.table(&rows_c), heads)?;
        let gq = rotate(&ga, rg.table(&rows_g), heads)?;
        assert!(max_diff(&back(&gq)?, &q)? < 1e-5, "{layout:?}");
        let pool_rows = [9u32, 2, 31, 0, 16];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let keys = Tensor::zeros((32, width), dtype, &cpu)?;
            let gkeys = Tensor::zeros((32, width), dtype, &gpu)?;
            write_rows(
                &keys,
                &b,
                &Tensor::new(&pool_rows, &cpu)?,
                Some(rc.table(&rows_c)),
                heads,
            )?;
            write_rows(
                &gkeys,
                &gb,
                &Tensor::new(&pool_rows, &gpu)?,
                Some(rg.table(&rows_g)),
                heads,
            )?;
            // Rounded to the pool's dtype: at most one unit apart.
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            assert!(
                max_diff(&back(&gkeys)?, &keys)? < tol,
                "{layout:?} {dtype:?}"
            );
        }
    }
    Ok(())
}
