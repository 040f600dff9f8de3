//! [`I16Matrix`] against a scalar reference of the same arithmetic (bit
//! for bit) and against f64 sums (within the rounding of its inputs).

use super::*;
use crate::dense_test_util::seeded;
use crate::TiledRows;

/// The kernel's arithmetic in plain loops: rows rounded as `quantize`
/// does, exact integer sums per pass of [`KC`] inputs, each entering the
/// result as `(sum * w_scale).mul_add(a_scale, acc)` from `start`.
fn reference(mat: &I16Matrix, x: &[f32], m: usize, start: &[f32], gelu: bool) -> Vec<f32> {
    let (n, k) = (mat.n, mat.k);
    let pairs = pairs(k);
    let weight = |c: usize, q: usize| {
        let lane = (c % NR / 8) * 16 + (c % 8) * 2;
        i32::from(mat.panels[c / NR * pairs + q / 2].0[lane + q % 2])
    };
    let mut out = start.to_vec();
    for r in 0..m {
        let row = &x[r * k..][..k];
        let (scale, inv) = scale_of(row, A_MAX);
        let qa: Vec<i32> = row.iter().map(|&v| round(v, inv, A_MAX)).collect();
        for c in 0..n {
            let mut acc = start[r * n + c];
            for pass in (0..k).step_by(KC) {
                let sum: i32 = (pass..k.min(pass + KC)).map(|q| qa[q] * weight(c, q)).sum();
                acc = (sum as f32 * mat.scales[c]).mul_add(scale, acc);
            }
            out[r * n + c] = if gelu {
                crate::math::gelu_erf::<true>(acc)
            } else {
                acc
            };
        }
    }
    out
}

/// `residual + bias` per row (the start of [`Start::BiasResidual`]).
fn plus_bias(residual: &[f32], bias: &[f32]) -> Vec<f32> {
    let mut v = residual.to_vec();
    for row in v.chunks_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
    v
}

/// Shapes with tails in rows (not a multiple of 6 or of a task's 48),
/// columns (not a multiple of 16), inputs (not a multiple of 8, past a
/// pass of 256), and the encoders' shapes.
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 16, 32),
    (3, 70, 33),
    (7, 1, 17),
    (50, 1152, 384),
    (13, 1536, 384),
    (97, 384, 1536),
    (13, 40, 300),
    (6, 16, 8),
];

#[test]
fn rounding_keeps_the_weights_within_half_a_step() {
    for (n, k) in [(1, 1), (3, 5), (16, 32), (70, 33), (130, 384)] {
        let w = seeded(n * k, 7);
        let m = I16Matrix::new(&w, n, k).unwrap();
        assert_eq!((m.n(), m.k()), (n, k));
        for (c, (got, want)) in m.weights().chunks(k).zip(w.chunks(k)).enumerate() {
            let top = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let step = top / W_MAX as f32;
            assert_eq!(m.scales[c], step);
            for (g, v) in got.iter().zip(want) {
                assert!((g - v).abs() <= step * 0.501, "{g} vs {v}");
            }
        }
    }
    assert!(I16Matrix::new(&[1.0; 6], 2, 4).is_err());
    assert!(I16Matrix::new(&[], 0, 4).is_err());
    // An all-zero column has scale 0 and stays zero.
    let m = I16Matrix::new(&[0.0, 0.0, 1.0, -2.0], 2, 2).unwrap();
    assert_eq!(m.scales[..2], [0.0, 2.0 / W_MAX as f32]);
    assert_eq!(m.weights()[..2], [0.0, 0.0]);
}

/// Every start, GELU, and tiled inputs and outputs give the reference's
/// bits.
#[test]
fn matches_the_scalar_reference_bit_for_bit() {
    if !I16Matrix::is_supported() {
        eprintln!("no AVX2 and FMA on this CPU: int16 kernel not run");
        return;
    }
    // Every instruction set the CPU has (the same sums).
    let madds = [Madd::Avx2, Madd::AvxVnni, Madd::Avx512Vnni]
        .into_iter()
        .filter(|m| m.is_available());
    eprintln!("int16 kernels: {:?}", madds.clone().collect::<Vec<_>>());
    for ((m, n, k), madd) in SHAPES
        .into_iter()
        .flat_map(|s| madds.clone().map(move |v| (s, v)))
    {
        let (x, w) = (seeded(m * k, 1), seeded(n * k, 2));
        let (bias, residual) = (seeded(n, 3), seeded(m * n, 4));
        let mat = I16Matrix::new(&w, n, k).unwrap();
        let shape = format!("[{m}, {n}, {k}] {madd:?}");

        let mut dst = residual.clone();
        let (acc, none) = (Start::Dst, Activation::None);
        mat.matmul_with(madd, Input::Rows(&x), m, acc, none, Output::Rows(&mut dst));
        assert_eq!(dst, reference(&mat, &x, m, &residual, false), "{shape}");

        let start = plus_bias(&residual, &bias);
        let mut got = vec![f32::NAN; m * n];
        let fused = Start::BiasResidual(&bias, &residual);
        mat.matmul_with(
            madd,
            Input::Rows(&x),
            m,
            fused,
            none,
            Output::Rows(&mut got),
        );
        assert_eq!(
            got,
            reference(&mat, &x, m, &start, false),
            "{shape} residual"
        );

        let mut tiled_x = TiledRows::new();
        tiled_x.pack(&x, k);
        let mut tiled = TiledRows::new();
        let (gelu, only_bias) = (Activation::GeluErf, Start::Bias(&bias));
        mat.matmul_with(
            madd,
            Input::Tiled(&tiled_x),
            m,
            only_bias,
            gelu,
            Output::Tiled(&mut tiled),
        );
        let start = plus_bias(&vec![0.0; m * n], &bias);
        let want = reference(&mat, &x, m, &start, true);
        assert_eq!(tiled.to_rows(), want, "{shape} bias, GELU, tiled");

        // Accumulating onto a tiled destination.
        let mut onto = TiledRows::new();
        onto.pack(&residual, n);
        mat.matmul_with(
            madd,
            Input::Rows(&x),
            m,
            Start::Dst,
            gelu,
            Output::Tiled(&mut onto),
        );
        let want = reference(&mat, &x, m, &residual, true);
        assert_eq!(onto.to_rows(), want, "{shape} accumulated, tiled");
    }
}

/// Within the rounding of the inputs of the f64 sums of the unrounded
/// values: each product is off by at most `|x| dw + |w| dx` with `dx`,
/// `dw` half a rounding step of its row and column.
#[test]
fn stays_within_the_input_rounding_of_f64_sums() {
    if !I16Matrix::is_supported() {
        return;
    }
    for (m, n, k) in SHAPES {
        let (x, w) = (seeded(m * k, 5), seeded(n * k, 6));
        let mat = I16Matrix::new(&w, n, k).unwrap();
        let mut got = vec![0f32; m * n];
        mat.matmul_acc(&x, m, &mut got);
        let top = |v: &[f32]| v.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
        for r in 0..m {
            let xr = &x[r * k..][..k];
            let dx = top(xr) / A_MAX as f64 / 2.0;
            for c in 0..n {
                let wc = &w[c * k..][..k];
                let dw = top(wc) / W_MAX as f64 / 2.0;
                let (mut exact, mut bound) = (0f64, 1e-6);
                for (&a, &b) in xr.iter().zip(wc) {
                    let (a, b) = (a as f64, b as f64);
                    exact += a * b;
                    bound += a.abs() * dw + b.abs() * dx + dx * dw + 1e-7 * (a * b).abs();
                }
                let got = got[r * n + c] as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "[{m}, {n}, {k}] ({r}, {c}): {got} vs {exact}"
                );
            }
        }
    }
}

/// The largest magnitudes everywhere, the sums at their extreme for every
/// pass of a 1536-input row: no pass overflows its i32.
#[test]
fn extreme_values_do_not_overflow() {
    if !I16Matrix::is_supported() {
        return;
    }
    let (m, n, k) = (7, 20, 1536);
    let x: Vec<f32> = (0..m * k)
        .map(|i| if (i / k) % 2 == 0 { 3.0 } else { -3.0 })
        .collect();
    let w = vec![-0.5f32; n * k];
    let mat = I16Matrix::new(&w, n, k).unwrap();
    let mut got = vec![0f32; m * n];
    mat.matmul_acc(&x, m, &mut got);
    for (r, row) in got.chunks(n).enumerate() {
        let want = if r % 2 == 0 { -1.5 } else { 1.5 } * k as f32;
        assert!(row.iter().all(|&v| v == want), "row {r}: {row:?}");
    }
}

/// A row's result does not depend on the other rows of the call (each row
/// has its own scale); all-zero rows give the start; columns past a
/// partial panel's end are left alone.
#[test]
fn rows_are_independent_of_the_batch() {
    if !I16Matrix::is_supported() {
        return;
    }
    let (n, k) = (100, 96);
    let mat = I16Matrix::new(&seeded(n * k, 8), n, k).unwrap();
    let mut x = seeded(50 * k, 9);
    x[7 * k..8 * k].fill(0.0);
    x[9 * k..10 * k].iter_mut().for_each(|v| *v *= 1000.0);
    let mut all = vec![0f32; 50 * n];
    mat.matmul_acc(&x, 50, &mut all);
    assert!(all[7 * n..8 * n].iter().all(|&v| v == 0.0));
    for r in [0, 5, 6, 7, 8, 9, 47, 48, 49] {
        let mut one = vec![1f32; n + 3];
        one[..n].fill(0.0);
        mat.matmul_acc(&x[r * k..][..k], 1, &mut one[..n]);
        assert_eq!(one[..n], all[r * n..][..n], "row {r}");
        assert_eq!(one[n..], [1.0; 3]);
    }
}
