//! Every format on every instruction set this CPU has (scalar included)
//! against f32 math on the dequantized weights.
//!
//! Tolerance: the only approximation of the kernels is the 8-bit rounding
//! of the activations (per 32 values, `d = max|x| / 127` stored as f16, so
//! each value is off by at most `0.5625 d`; for Q2_K and Q3_K per 256
//! values, `d` in f32; the block sum `s` used with the
//! weight offsets `m` is f16 too, see `act.rs`), so each output must be
//! within `sum_j 0.5625 |w_j| d(j) + sum_b |m_b| 2^-10 (sum_{j in b}
//! |x_j| + 16 d_b)` (+ `1e-5 sum_j |w_j x_j|` for f32 summation order) of the f64
//! reference (the K-quants too: Q4_K's offsets are its `-dmin mn`). On top, over each
//! output matrix, the RMS error must stay
//! below twice the RMS that rounding errors uniform in `[-d/2, d/2]` give
//! (`sqrt(sum_j w_j^2 d(j)^2 / 12)`), which catches a
//! biased rounding; relative to the reference that is about 1% RMS here, as
//! 3% of the activations are 4x outliers that coarsen their block's step
//! (about 0.4% without them). The test prints the worst ratios seen. The
//! SIMD paths must agree with the scalar one within `1e-5 sum_j |w_j x_j|`
//! (they differ only in f32 summation order).
//!
//! N = 37 and 100 also exercise the padded last group of eight rows of the
//! interleaved layouts.

mod common;

use common::{quantize, Rng};
use hearth_kernels::{Format, Isa, QuantMatrix};

#[test]
fn blocks_decode_as_the_reference_quantizer_says() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for format in Format::ALL {
        let (n, k) = (5, 2 * format.block_values().max(256));
        let w = rng.matrix(n * k);
        let (bytes, want, _) = quantize(format, &w);
        let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
        assert_eq!((q.n(), q.k(), q.format()), (n, k, format));
        assert_eq!(q.dequantize(), want, "{format:?}");
        // The quantizer is sane: every weight within a step of its original
        // (Q3_K's step is a quarter of its 16 values' largest magnitude, up
        // to 40 here: half a step is 5; Q2_K's a third of their range, up to
        // 80: half a step 13.3, and up to 1.5 scale units more where the
        // rounded scale clamps the top value, and half a min unit).
        let err = w
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        let most = match format {
            Format::Q3K => 5.01,
            Format::Q2K => 18.0,
            _ => 3.0,
        };
        assert!(err < most, "{format:?}: quantization error {err}");
    }
}

#[test]
fn single_rows_decode_as_the_whole_matrix() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for format in Format::ALL {
        // 13 rows: a padded last group of eight in the interleaved layouts.
        let (n, k) = (13, 2 * format.block_values().max(256));
        let (bytes, want, _) = quantize(format, &rng.matrix(n * k));
        let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
        let mut rows = Vec::new();
        for r in [12, 0, 7, 8, 3] {
            rows.clear();
            q.dequantize_row(r, &mut rows);
            assert_eq!(rows, want[r * k..(r + 1) * k], "{format:?} row {r}");
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let bytes = vec![0u8; 18 * 4];
    assert!(QuantMatrix::new(Format::Q4_0, &bytes, 2, 64).is_ok());
    assert!(QuantMatrix::new(Format::Q4_0, &bytes, 2, 60).is_err());
    assert!(QuantMatrix::new(Format::Q4_0, &bytes, 3, 64).is_err());
    assert!(QuantMatrix::new(Format::Q4K, &[0u8; 144 * 2], 1, 288).is_err());
    assert!(QuantMatrix::from_f32_q8_0(&[0.0; 64], 2, 32).is_ok());
    assert!(QuantMatrix::from_f32_q8_0(&[0.0; 64], 1, 48).is_err());
}

/// f64 reference and the per-output bound (see the module docs).
#[allow(clippy::type_complexity)]
fn reference(
    w: &[f32],
    offsets: &[f32],
    x: &[f32],
    n: usize,
    k: usize,
    span: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, f64) {
    let m = x.len() / k;
    // Activation scale per 32 values (repeated over a longer span).
    let dx: Vec<f32> = x
        .chunks(span)
        .flat_map(|b| {
            let d = b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            std::iter::repeat_n(d, span / 32)
        })
        .collect();
    let (mut want, mut bound, mut mag) = (vec![0f32; m * n], vec![0f32; m * n], vec![0f32; m * n]);
    let mut var = 0f64;
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        let dr = &dx[i * k / 32..(i + 1) * k / 32];
        for o in 0..n {
            let wr = &w[o * k..(o + 1) * k];
            let (mut y, mut e, mut a) = (0f64, 0f64, 0f64);
            for b in 0..k / 32 {
                let sx: f32 = xr[32 * b..32 * b + 32].iter().map(|v| v.abs()).sum();
                let m = offsets[o * k / 32 + b].abs();
                e += (m * (sx + 16.0 * dr[b]) / 1024.0) as f64;
            }
            for j in 0..k {
                y += wr[j] as f64 * xr[j] as f64;
                e += (wr[j].abs() * dr[j / 32]) as f64 * 0.5625;
                var += ((wr[j] * dr[j / 32]) as f64).powi(2) / 12.0;
                a += (wr[j] * xr[j]).abs() as f64;
            }
            want[i * n + o] = y as f32;
            mag[i * n + o] = a as f32;
            bound[i * n + o] = (e * 1.0001 + 1e-5 * a + 1e-5) as f32;
        }
    }
    (want, bound, mag, var)
}

fn check_format(format: Format, ks: &[usize]) {
    let isas = Isa::available();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ format.block_bytes() as u64);
    let (mut worst, mut worst_rms) = (0f32, 0f32);
    for &k in ks {
        for n in [16usize, 37, 100, 576] {
            let (bytes, deq, offsets) = quantize(format, &rng.matrix(n * k));
            let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
            for m in [1usize, 3, 7, 13, 16, 64] {
                let x: Vec<f32> = (0..m * k)
                    .map(|_| {
                        let v = rng.next_f32();
                        if rng.next_f32() > 0.97 {
                            4.0 * v
                        } else {
                            v
                        }
                    })
                    .collect();
                let (want, bound, mag, var) =
                    reference(&deq, &offsets, &x, n, k, format.activation_span(m));
                let max_ref = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                let mut scalar = vec![0f32; m * n];
                q.matmul_with(Isa::Scalar, &x, m, &mut scalar);
                for &isa in &isas {
                    let mut got = vec![f32::NAN; m * n];
                    q.matmul_with(isa, &x, m, &mut got);
                    let (mut max_err, mut se, mut sr) = (0f32, 0f64, 0f64);
                    for e in 0..m * n {
                        let diff = (got[e] - want[e]).abs();
                        max_err = max_err.max(diff);
                        se += (diff as f64).powi(2);
                        sr += (want[e] as f64).powi(2);
                        assert!(
                            diff <= bound[e],
                            "{format:?} {isa:?} m={m} k={k} n={n} at {e}: got {} want {} (bound {})",
                            got[e],
                            want[e],
                            bound[e]
                        );
                        let simd = (got[e] - scalar[e]).abs();
                        assert!(
                            simd <= 1e-5 * mag[e] + 1e-6,
                            "{format:?} {isa:?} m={m} k={k} n={n} at {e}: {} vs scalar {}",
                            got[e],
                            scalar[e]
                        );
                    }
                    let rel_rms = (se / sr).sqrt() as f32;
                    assert!(
                        se <= 4.0 * var,
                        "{format:?} {isa:?} m={m} k={k} n={n}: rms err {} > 2 x {}",
                        (se / (m * n) as f64).sqrt(),
                        (var / (m * n) as f64).sqrt()
                    );
                    worst = worst.max(max_err / max_ref);
                    worst_rms = worst_rms.max(rel_rms);
                }
            }
        }
    }
    println!(
        "{format:?} on {isas:?}: worst max|err| / max|ref| = {worst:.2e}, worst relative rms {worst_rms:.2e}"
    );
}

#[test]
fn q4_0() {
    check_format(Format::Q4_0, &[32, 96, 576, 1536]);
}

#[test]
fn q4_1() {
    check_format(Format::Q4_1, &[32, 96, 576, 1536]);
}

#[test]
fn q5_0() {
    check_format(Format::Q5_0, &[32, 96, 576, 1536]);
}

#[test]
fn q5_1() {
    check_format(Format::Q5_1, &[32, 96, 576, 1536]);
}

#[test]
fn q8_0() {
    check_format(Format::Q8_0, &[32, 96, 576, 1536]);
}

#[test]
fn q2_k() {
    check_format(Format::Q2K, &[256, 512, 1536]);
}

#[test]
fn q3_k() {
    check_format(Format::Q3K, &[256, 512, 1536]);
}

#[test]
fn q4_k() {
    check_format(Format::Q4K, &[256, 512, 1536]);
}

#[test]
fn q5_k() {
    check_format(Format::Q5K, &[256, 512, 1536]);
}

#[test]
fn q6_k() {
    check_format(Format::Q6K, &[256, 512, 1536]);
}

/// `from_f32_q8_0` (the head quantizer) puts each weight within half a
/// step of its block (`d = max|w| / 127`, stored as f16) of the original.
#[test]
fn f32_to_q8_0() {
    let mut rng = Rng(7);
    let (n, k) = (3, 96);
    let w = rng.matrix(n * k);
    let q = QuantMatrix::from_f32_q8_0(&w, n, k).unwrap();
    for (b, (deq, orig)) in q.dequantize().chunks(32).zip(w.chunks(32)).enumerate() {
        let amax = orig.iter().fold(0f32, |a, v| a.max(v.abs()));
        let bound = 0.5 * amax / 127.0 + amax / 1024.0;
        for (x, y) in deq.iter().zip(orig) {
            assert!((x - y).abs() <= bound, "block {b}: {x} vs {y}");
        }
    }
}

/// Zero rows and all-zero activation blocks give exact zeros.
#[test]
fn zeros() {
    for isa in Isa::available() {
        let q = QuantMatrix::from_f32_q8_0(&[0.0; 64], 2, 32).unwrap();
        let mut out = [1f32; 4];
        q.matmul_with(isa, &[0.0; 64], 2, &mut out);
        assert_eq!(out, [0.0; 4]);
        q.matmul_with(isa, &[], 0, &mut []);
    }
}

/// A Q4_0 block whose offset `-8 d` overflows f16 (the kernels keep
/// offsets as f16) is refused rather than computed wrong.
#[test]
fn unrepresentable_q4_0_offset_is_an_error() {
    let mut block = vec![0u8; 18];
    block[..2].copy_from_slice(&half::f16::MAX.to_le_bytes());
    let err = QuantMatrix::new(Format::Q4_0, &block, 1, 32).unwrap_err();
    assert!(err.0.contains("not an f16 value"), "{err}");
    block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
    assert!(QuantMatrix::new(Format::Q4_0, &block, 1, 32).is_ok());
}

/// Three matrices of `k` columns: Q4_1, Q8_0 and Q4_K (32-value formats
/// and K-quants mixed), of 576, 40 and 37 rows.
fn mixed_matrices(rng: &mut Rng, k: usize) -> Vec<QuantMatrix> {
    [(Format::Q4_1, 576), (Format::Q8_0, 40), (Format::Q4K, 37)]
        .into_iter()
        .map(|(format, n)| {
            let (bytes, _, _) = quantize(format, &rng.matrix(n * k));
            QuantMatrix::new(format, &bytes, n, k).unwrap()
        })
        .collect()
}

/// The outputs `run` writes for `m` rows through each of `mats` (NaN where
/// it writes nothing).
fn outputs_of(
    mats: &[QuantMatrix],
    m: usize,
    run: impl FnOnce(&mut [(&QuantMatrix, &mut [f32])]),
) -> Vec<Vec<f32>> {
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; m * w.n()]).collect();
    let mut pairs: Vec<(&QuantMatrix, &mut [f32])> = mats
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, o)| (w, o.as_mut_slice()))
        .collect();
    run(&mut pairs);
    outs
}

/// `matmul_many` (one quantized input, one parallel loop over the chunks of
/// every matrix) gives each matrix exactly its own `matmul`, 32-value
/// formats and K-quants mixed, on every instruction set.
#[test]
fn many_matrices_share_one_input() {
    let mut rng = Rng(99);
    let k = 512;
    let mats = mixed_matrices(&mut rng, k);
    for isa in Isa::available() {
        for m in [1usize, 5, 64] {
            let x = rng.matrix(m * k);
            let outs = outputs_of(&mats, m, |pairs| {
                QuantMatrix::matmul_many_with(isa, pairs, &x, m)
            });
            for (w, got) in mats.iter().zip(&outs) {
                let mut want = vec![0f32; m * w.n()];
                w.matmul_with(isa, &x, m, &mut want);
                assert_eq!(got, &want, "{:?} {isa:?} m={m}", w.format());
            }
        }
    }
}

/// `matmul_many_beside` gives the outputs of `matmul_many` and runs each
/// side task exactly once, in the parallel loop (enough work) and on one
/// thread (little), and with no matrices at all.
#[test]
fn side_tasks_run_once_beside_the_chunks() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut rng = Rng(7);
    let k = 512;
    let mats = mixed_matrices(&mut rng, k);
    for (used, m) in [(3, 1usize), (3, 5), (1, 1), (1, 64)] {
        let mats = &mats[..used];
        let x = rng.matrix(m * k);
        for sides in [0usize, 1, 3, 20] {
            let runs: Vec<AtomicUsize> = (0..sides).map(|_| AtomicUsize::new(0)).collect();
            let outs = outputs_of(mats, m, |pairs| {
                QuantMatrix::matmul_many_beside(pairs, &x, m, sides, &|i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                })
            });
            for (w, got) in mats.iter().zip(&outs) {
                let mut want = vec![0f32; m * w.n()];
                w.matmul(&x, m, &mut want);
                assert_eq!(got, &want, "{:?} m={m} sides={sides}", w.format());
            }
            let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::Relaxed)).collect();
            assert_eq!(counts, vec![1; sides], "m={m} matrices={used}");
        }
    }
    let runs = AtomicUsize::new(0);
    QuantMatrix::matmul_many_beside(&mut [], &[], 0, 4, &|_| {
        runs.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(runs.into_inner(), 4);
}

/// The start-up check that decides whether the VNNI kernels are used
/// passes for every instruction set this CPU has, against the portable
/// kernels, and the chosen one is available.
#[test]
fn every_instruction_set_passes_the_start_up_self_check() {
    for isa in Isa::available() {
        isa.self_check(Isa::Scalar)
            .unwrap_or_else(|e| panic!("{isa:?}: {e}"));
    }
    assert!(Isa::best().is_available());
    assert_ne!(
        Isa::best(),
        Isa::Avx512,
        "AVX-512 without VNNI runs the AVX2 kernels"
    );
}

/// `q` times the `m` rows of `x` with `isa` gives the AVX2 kernels' bits.
fn assert_equals_avx2_bit_for_bit(isa: Isa, q: &QuantMatrix, x: &[f32], m: usize, what: &str) {
    let n = q.n();
    let (mut avx2, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
    q.matmul_with(Isa::Avx2, x, m, &mut avx2);
    q.matmul_with(isa, x, m, &mut got);
    for (e, (a, v)) in avx2.iter().zip(&got).enumerate() {
        assert_eq!(
            a.to_bits(),
            v.to_bits(),
            "{what} at {e}: AVX2 {a} {isa:?} {v}"
        );
    }
}

/// Whether `HEARTH_KERNELS_AVX512=0` makes this process stand in for a
/// CPU without AVX-512: the K-quants' activation scales and AVX2 tiles are
/// then that CPU's, which the 512-bit and AMX tiles do not match bit for
/// bit.
fn avx512_left_out() -> bool {
    std::env::var_os("HEARTH_KERNELS_AVX512").is_some_and(|v| v == "0")
}

/// The AMX tiles (16 activation rows by a pair of groups, in prompt steps
/// of more than 16 rows) give the AVX2 kernels' results bit for bit, as
/// the 512-bit tiles do: the same integer sums, then the same float
/// operations in the same order. 17 rows are one AMX tile and one row on
/// the 512-bit tiles, 45 two tiles and 13 rows; 16 and 48 weight rows take
/// the activations regrouped by tiles of 16, 37 and 100 in row order
/// (they end in a lone group, on the 256-bit tiles); k = 512 (16 blocks,
/// two Q3_K spans) and 544 (17 blocks: the odd last block alone).
#[test]
fn amx_kernels_equal_avx2_bit_for_bit() {
    if !Isa::Amx.is_available() {
        eprintln!("skipped: this CPU (or kernel) offers no AMX int8 tiles");
        return;
    }
    if avx512_left_out() {
        eprintln!("skipped: HEARTH_KERNELS_AVX512=0");
        return;
    }
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for format in Format::ALL {
        for k in [512usize, 544] {
            if k % format.block_values() != 0 {
                continue;
            }
            for n in [16usize, 37, 48, 100] {
                let (bytes, _, _) = quantize(format, &rng.matrix(n * k));
                let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
                for m in [17usize, 32, 45] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.next_f32()).collect();
                    let what = format!("{format:?} k={k} m={m} n={n}");
                    assert_equals_avx2_bit_for_bit(Isa::Amx, &q, &x, m, &what);
                }
            }
        }
    }
    // Q3_K beside Q2_K (no AMX tiles) on one input: the activations then
    // keep the 512-bit tiles' layout for both.
    let (k, n, m) = (512, 48, 40);
    let mats: Vec<QuantMatrix> = [Format::Q3K, Format::Q2K]
        .into_iter()
        .map(|f| QuantMatrix::new(f, &quantize(f, &rng.matrix(n * k)).0, n, k).unwrap())
        .collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.next_f32()).collect();
    let run = |isa: Isa| {
        let mut outs = vec![vec![0f32; m * n]; 2];
        let mut pairs: Vec<(&QuantMatrix, &mut [f32])> = mats
            .iter()
            .zip(outs.iter_mut().map(|o| &mut o[..]))
            .collect();
        QuantMatrix::matmul_many_with(isa, &mut pairs, &x, m);
        outs
    };
    let (avx2, amx) = (run(Isa::Avx2), run(Isa::Amx));
    for (want, got) in avx2.iter().zip(&amx) {
        assert!(want
            .iter()
            .zip(got)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

/// The VNNI kernels, 256-bit for up to four activation rows and two groups
/// per 512-bit register for more, give the AVX2 kernels' results bit for bit:
/// both sum the blocks exactly in integers and do the same float operations
/// in the same order. Shapes cover paired groups, a lone last group (37 and
/// 100 rows), tiles of 1 to 8 activation rows (3 on the 256-bit tiles, 3
/// and 5 to 7 unpacked per tile up to 16 rows), and blocks unpacked ahead
/// (40 and 45 activation rows), there with the rows regrouped by tiles (16
/// and 48 weight rows: 45 as five tiles of 8, one of 4 and one of 1) or in
/// order (37 and 100, whose lone last group reads them in order); 64
/// weight rows run Q3_K's tiles of two group pairs.
///
/// The AVX-VNNI kernels (256-bit tiles for every step) too, where the CPU
/// has both: there every instruction set's prompt steps sum Q4_K and Q5_K
/// blocks the same way, AVX-VNNI's in tiles of eight activation rows (11,
/// 13, 16, 40 and 45 rows: one to five such tiles, then tiles of up to
/// four). (On a CPU with AVX-VNNI alone, AVX2 sums those
/// per super-block in integers and AVX-VNNI per block in floats; the
/// start-up check and the per-format tests (`check_format`) hold them to
/// the reference there.)
#[test]
fn vnni_kernels_equal_avx2_bit_for_bit() {
    if !Isa::Avx512Vnni.is_available() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    if avx512_left_out() {
        eprintln!("skipped: HEARTH_KERNELS_AVX512=0");
        return;
    }
    let isas: Vec<Isa> = [Isa::Avx512Vnni, Isa::AvxVnni]
        .into_iter()
        .filter(|i| i.is_available())
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for format in Format::ALL {
        let k = 512;
        for n in [16usize, 37, 48, 64, 100] {
            let (bytes, _, _) = quantize(format, &rng.matrix(n * k));
            let q = QuantMatrix::new(format, &bytes, n, k).unwrap();
            for m in [1usize, 2, 3, 4, 5, 6, 7, 11, 13, 16, 40, 45] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.next_f32()).collect();
                for &isa in &isas {
                    let what = format!("{format:?} m={m} n={n}");
                    assert_equals_avx2_bit_for_bit(isa, &q, &x, m, &what);
                }
            }
        }
    }
}

/// The activations' scale spans: Q4_K, Q5_K and Q6_K take llama.cpp's
/// Q8_K spans of 256 values in prompt steps (more than four rows)
/// everywhere, and in decode steps where the CPU has no AVX-512 VNNI; on
/// CPUs with it their decode steps keep 32-value scales (unless
/// `HEARTH_KERNELS_AVX512=0` leaves AVX-512 out). Q2_K and Q3_K always
/// take 256, the 32-value formats 32.
#[test]
fn k_quant_activation_spans_follow_the_step() {
    let vnni = Isa::Avx512Vnni.is_available() && !avx512_left_out();
    for format in [Format::Q4K, Format::Q5K, Format::Q6K] {
        for rows in [5usize, 16, 512] {
            assert_eq!(format.activation_span(rows), 256, "{format:?} {rows}");
        }
        for rows in 1..=4 {
            let want = if vnni { 32 } else { 256 };
            assert_eq!(format.activation_span(rows), want, "{format:?} {rows}");
        }
    }
    for rows in [1usize, 4, 5, 64] {
        assert_eq!(Format::Q2K.activation_span(rows), 256);
        assert_eq!(Format::Q3K.activation_span(rows), 256);
        assert_eq!(Format::Q8_0.activation_span(rows), 32);
        assert_eq!(Format::Q4_1.activation_span(rows), 32);
    }
}
