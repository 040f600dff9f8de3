//! The kernels' first use from many rayon jobs at once, as when several
//! models (or engines) start their first forward passes together: the
//! start-up self-checks run inside `OnceLock` initialisers reached on the
//! global pool's workers. They once ran their products on that pool, and
//! two engines starting together hung (a worker waiting for a piece of the
//! check took the other engine's job, which asked for the same `OnceLock`).
//! That race is rare from outside (a few runs in a hundred of a process
//! starting two products at once); `isolated.rs` reproduces it every time
//! with a stand-in check and shows the checks' own pool prevents it. Here:
//! the real first use from many jobs finishes, with the right products.
//!
//! Its own test binary (its own process), so that no other test has run
//! the checks first. Where the CPU offers nothing to check (no AVX-512
//! VNNI, no AMX) the checks do not run.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use hearth_kernels::{quantize_q8_0, Bf16Matrix, Format, QuantMatrix};
use rayon::prelude::*;

/// Values in [-1, 1) from a fixed sequence.
fn values(seed: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 263) as f32 / 131.5 - 1.0)
        .collect()
}

#[test]
fn first_products_from_many_jobs_at_once_finish() {
    let (n, k) = (256, 512);
    let q8 = QuantMatrix::new(Format::Q8_0, &quantize_q8_0(&values(1, n * k)), n, k).unwrap();
    let q8 = Arc::new(q8);
    // The bf16 products only where the CPU has AVX-512 BF16.
    let bf16 = Bf16Matrix::new(&values(1, n * k), n, k)
        .ok()
        .filter(|_| Bf16Matrix::is_supported())
        .map(Arc::new);
    let (done, finished) = mpsc::channel();
    // Eight threads outside the pool each start a parallel loop whose
    // items are products big enough to split across the pool themselves.
    for t in 0..8 {
        let (q8, bf16, done) = (q8.clone(), bf16.clone(), done.clone());
        std::thread::spawn(move || {
            let sums: Vec<(f32, f32)> = (0..4usize)
                .into_par_iter()
                .map(|j| {
                    let m = 64;
                    let x = values(t * 4 + j + 3, m * k);
                    let mut out = vec![0f32; m * n];
                    q8.matmul(&x, m, &mut out);
                    let size = out.iter().map(|v| v.abs()).sum::<f32>();
                    let Some(b) = &bf16 else {
                        return (size, 0.0);
                    };
                    let mut acc = vec![0f32; m * n];
                    b.matmul_acc(&x, m, &mut acc);
                    let diff = out.iter().zip(&acc).map(|(o, a)| (o - a).abs()).sum();
                    (size, diff)
                })
                .collect();
            let _ = done.send(sums);
        });
    }
    drop(done);
    for _ in 0..8 {
        let sums = finished
            .recv_timeout(Duration::from_secs(120))
            .expect("the kernels' first products did not finish within two minutes (deadlock)");
        // Both products of the same weights and inputs: their roundings
        // (8-bit activations and weights; bf16) differ by a few percent.
        for (size, diff) in sums {
            assert!(size > (64 * n) as f32, "{size}");
            assert!(diff < 0.05 * size, "{diff} against {size}");
        }
    }
}
