//! Test helpers shared by the dense (unquantized) kernels' tests.

/// `len` values in [-1, 1) from a fixed generator.
pub(crate) fn seeded(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `dst` against `base + x W^T` in f64 on the inputs as the kernel sees
/// them (`round`: the identity for f32, bf16 rounding for bf16), within
/// `1e-6` of the sum of the products' magnitudes.
pub(crate) fn assert_near_f64(
    x: &[f32],
    w: &[f32],
    base: &[f32],
    dst: &[f32],
    mnk: (usize, usize, usize),
    round: fn(f32) -> f64,
) {
    let (m, n, k) = mnk;
    let (xr, wr): (Vec<f64>, Vec<f64>) = (
        x.iter().map(|&v| round(v)).collect(),
        w.iter().map(|&v| round(v)).collect(),
    );
    for r in 0..m {
        for c in 0..n {
            let dot: f64 = (0..k).map(|i| xr[r * k + i] * wr[c * k + i]).sum();
            let want = base[r * n + c] as f64 + dot;
            let got = dst[r * n + c] as f64;
            let scale: f64 = (0..k).map(|i| (xr[r * k + i] * wr[c * k + i]).abs()).sum();
            assert!(
                (got - want).abs() <= 1e-6 * (scale + 1.0),
                "[{m}, {n}, {k}] ({r}, {c}): {got} vs {want}"
            );
        }
    }
}
