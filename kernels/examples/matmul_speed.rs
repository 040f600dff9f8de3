//! Throughput of [`QuantMatrix::matmul_with`] per format, instruction set
//! and activation row count, on SmolLM2-135M's shapes.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p hearth-kernels --example
//! matmul_speed [FORMAT...]` (formats as `Q4_1`, `Q8_0`, `Q4K`, ...; all by
//! default). Prints the best of several runs, as GFLOP/s (`2 m n k` flops).

use std::time::{Duration, Instant};

use hearth_kernels::{Format, Isa, QuantMatrix};

/// Best time of `f` over at least 5 runs and about 0.3 s.
fn best_of(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut runs = 0;
    while runs < 5 || start.elapsed() < Duration::from_millis(300) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

/// Random bytes with every f16 scale field set to a small normal value, so
/// no block decodes to inf/NaN (the speed does not depend on the values).
fn random_blocks(format: Format, blocks: usize) -> Vec<u8> {
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    let mut bytes: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match format {
        Format::Q4_0 | Format::Q5_0 | Format::Q8_0 => &[0],
        Format::Q4_1 | Format::Q5_1 | Format::Q4K => &[0, 2],
        Format::Q6K => &[208],
    };
    for b in bytes.chunks_exact_mut(format.block_bytes()) {
        for &f in fields {
            b[f..f + 2].copy_from_slice(&scale);
        }
    }
    bytes
}

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    println!(
        "rayon threads: {}, instruction sets: {:?}",
        rayon::current_num_threads(),
        Isa::available()
    );
    for format in Format::ALL {
        if !wanted.is_empty() && !wanted.iter().any(|w| *w == format!("{format:?}")) {
            continue;
        }
        // K-quants need k % 256 == 0: ffn_down's [576, 1536] shape.
        let shapes: &[(usize, usize)] = if format.block_values() == 256 {
            &[(576, 1536)]
        } else {
            &[(1536, 576), (576, 1536)]
        };
        for &(n, k) in shapes {
            let bytes = random_blocks(format, n * k / format.block_values());
            let q = QuantMatrix::new(format, &bytes, n, k).expect("valid shape");
            for isa in Isa::available() {
                let mut line = format!("{format:?} n={n} k={k} {isa:?}:");
                for m in [1usize, 16, 64] {
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                        .collect();
                    let mut out = vec![0f32; m * n];
                    let t = best_of(|| q.matmul_with(isa, &x, m, &mut out));
                    let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
                    line += &format!("  M={m}: {gflops:6.1} GFLOP/s ({:7.1} us)", t * 1e6);
                }
                println!("{line}");
            }
        }
    }
}
