//! With [`hearth_kernels::set_batch_invariant`] (a choice made once per
//! process, hence a test binary of its own), an activation row's product
//! is the same bits whether the row is alone in its call or one of many:
//! every format, on every instruction set this CPU has, for the step sizes
//! that pick different tiles (decode tiles of one to four rows, the
//! 512-bit and AMX prompt tiles of 16, the rows left over after them).

mod common;

use common::{quantize, Rng};
use hearth_kernels::{Format, Isa, QuantMatrix};

#[test]
fn a_row_alone_gives_the_bits_it_gives_among_others() {
    assert!(hearth_kernels::set_batch_invariant(true));
    assert!(hearth_kernels::batch_invariant());
    // Set once: the other choice is refused from now on.
    assert!(!hearth_kernels::set_batch_invariant(false));
    let mut rng = Rng(0x5851_F42D_4C95_7F2D);
    // 75 rows: nine whole groups of eight and a padded last one.
    let (n, k, most) = (75, 1024, 40);
    for format in Format::ALL {
        let (bytes, _, _) = quantize(format, &rng.matrix(n * k));
        let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
        let mut x = rng.matrix(most * k);
        // Outliers, as real activations have: they set their blocks' scales.
        for i in (0..x.len()).step_by(97) {
            x[i] *= 8.0;
        }
        for isa in Isa::available() {
            let alone: Vec<Vec<f32>> = (0..most)
                .map(|r| {
                    let mut out = vec![0f32; n];
                    q.matmul_with(isa, &x[r * k..(r + 1) * k], 1, &mut out);
                    out
                })
                .collect();
            for m in [2, 3, 4, 5, 8, 16, 17, 33, most] {
                let mut out = vec![0f32; m * n];
                q.matmul_with(isa, &x[..m * k], m, &mut out);
                for (r, want) in alone.iter().enumerate().take(m) {
                    let got = &out[r * n..(r + 1) * n];
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{format:?} on {isa:?}: row {r} of {m} differs from it alone"
                    );
                }
            }
        }
    }
}
