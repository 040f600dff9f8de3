//! CPU matmul for GGML Q4_1 weights, as a candle custom op.
//!
//! candle 0.11 has SIMD kernels for Q4_0, Q8_0 and the K-quants but runs
//! Q4_1 (the default SmolLM2 file) through a scalar loop, which made it the
//! whole cost of a decode step. This op does the same arithmetic as
//! llama.cpp's `ggml_vec_dot_q4_1_q8_1`:
//! - each 32-value block of a weight row is `d * q + m` with 4-bit `q`;
//! - the activation row is quantized to Q8_1 blocks: `d = max|x| / 127`
//!   (stored as f16), `q = round(x * 127 / max|x|)` and the block sum
//!   `s = f16(d * sum(q))`, exactly as llama.cpp does;
//! - `dot = sum_blocks d_w d_x sum(q_w q_x) + m_w s_x`.
//!
//! The inner loop has a portable version and an AVX2 one (picked at run
//! time), tested against each other. The AVX2 kernel works on tiles of one
//! weight row x up to 8 activation rows, so for a batch of `M` activation
//! rows each weight block is read and unpacked `M / 8` times rather than `M`
//! times (and stays in L1 across them, as the output columns are walked in
//! chunks of 16 weight rows). Chunks are split across rayon threads when
//! there is enough work.
//!
//! This belongs in `hearth-kernels` once that crate exists.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use half::f16;
use rayon::prelude::*;

const QK: usize = 32;
/// Bytes of one GGML `block_q4_1`: f16 d, f16 m, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;
/// Multiply-adds below which the op stays on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// The 32 4-bit values of one weight block: byte `j` holds value `j` (low
/// nibble) and `j + 16` (high). Aligned so the AVX2 kernel loads it with one
/// aligned load.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy)]
struct Nibbles([u8; 16]);

/// The 32 8-bit values of one activation block (aligned likewise).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
struct Quants([i8; QK]);

/// A Q4_1 matrix `[n, k]` (rows are output features), unpacked for the CPU.
#[derive(Debug)]
pub(crate) struct Q4_1Matrix {
    n: usize,
    k: usize,
    /// Scale `d` per block, row major, `n * k / 32` entries.
    d: Vec<f32>,
    /// Offset `m` per block, laid out as `d`.
    m: Vec<f32>,
    /// Nibbles per block, laid out as `d`.
    qs: Vec<Nibbles>,
}

/// One activation row quantized to Q8_1.
struct Q8_1Row {
    d: Vec<f32>,
    s: Vec<f32>,
    qs: Vec<Quants>,
}

impl Q4_1Matrix {
    /// From a GGUF tensor of dtype Q4_1 and shape `[n, k]`, `k % 32 == 0`.
    pub(crate) fn from_qtensor(q: &QTensor) -> Result<Self> {
        if q.dtype() != GgmlDType::Q4_1 {
            candle_core::bail!("expected a Q4_1 tensor, got {:?}", q.dtype())
        }
        let (n, k) = q.shape().dims2()?;
        if k % QK != 0 {
            candle_core::bail!("Q4_1 row length {k} is not a multiple of {QK}")
        }
        let data = q.data()?;
        let blocks = n * k / QK;
        if data.len() != blocks * BLOCK_BYTES {
            candle_core::bail!("Q4_1 data of {} bytes for {blocks} blocks", data.len())
        }
        let (mut d, mut m) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
        let mut qs = Vec::with_capacity(blocks);
        for b in data.chunks_exact(BLOCK_BYTES) {
            d.push(f16::from_le_bytes([b[0], b[1]]).to_f32());
            m.push(f16::from_le_bytes([b[2], b[3]]).to_f32());
            qs.push(Nibbles(b[4..].try_into().expect("16 bytes")));
        }
        Ok(Self { n, k, d, m, qs })
    }

    /// The matrix as f32, row major (for tests).
    #[cfg(test)]
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        for ((&d, &m), q) in self.d.iter().zip(&self.m).zip(&self.qs) {
            out.extend(q.0.iter().map(|&v| d * (v & 0xF) as f32 + m));
            out.extend(q.0.iter().map(|&v| d * (v >> 4) as f32 + m));
        }
        out
    }
}

/// llama.cpp's `quantize_row_q8_1` (AVX2 variant: round half to even).
#[inline(always)]
fn quantize_q8_1_body(x: &[f32]) -> Q8_1Row {
    let nb = x.len() / QK;
    let mut row = Q8_1Row {
        d: Vec::with_capacity(nb),
        s: Vec::with_capacity(nb),
        qs: Vec::with_capacity(nb),
    };
    for block in x.chunks_exact(QK) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut q = [0i8; QK];
        let mut sum = 0i32;
        for (q, &v) in q.iter_mut().zip(block) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        row.d.push(f16::from_f32(d).to_f32());
        row.s.push(f16::from_f32(d * sum as f32).to_f32());
        row.qs.push(Quants(q));
    }
    row
}

/// [`quantize_q8_1_body`] compiled with SSE4.1, whose `roundps` replaces a
/// libm `rintf` call per value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
fn quantize_q8_1_sse41(x: &[f32]) -> Q8_1Row {
    quantize_q8_1_body(x)
}

fn quantize_q8_1(x: &[f32]) -> Q8_1Row {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the CPU supports the feature the function is compiled for.
        return unsafe { quantize_q8_1_sse41(x) };
    }
    quantize_q8_1_body(x)
}

/// Dot products of weight rows `rows` with one activation row, into `out`
/// (the portable path, one pair at a time).
fn dot_rows_impl(w: &Q4_1Matrix, a: &Q8_1Row, rows: std::ops::Range<usize>, out: &mut [f32]) {
    let nb = w.k / QK;
    for (o, r) in out.iter_mut().zip(rows) {
        let mut acc = 0f32;
        for b in 0..nb {
            let i = r * nb + b;
            let (wq, aq) = (&w.qs[i].0, &a.qs[b].0);
            let mut isum = 0i32;
            for j in 0..16 {
                isum +=
                    (wq[j] & 0xF) as i32 * aq[j] as i32 + (wq[j] >> 4) as i32 * aq[j + 16] as i32;
            }
            acc += w.d[i] * a.d[b] * isum as f32 + w.m[i] * a.s[b];
        }
        *o = acc;
    }
}

/// `sum_b m[b] * s[b]`, the offsets' share of a Q4_1 x Q8_1 dot product, in
/// four independent partial sums.
#[inline(always)]
fn dot_mins(m: &[f32], s: &[f32]) -> f32 {
    let mut p = [0f32; 4];
    let (mc, sc) = (m.chunks_exact(4), s.chunks_exact(4));
    let tail: f32 = mc
        .remainder()
        .iter()
        .zip(sc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in mc.zip(sc) {
        for l in 0..4 {
            p[l] += a[l] * b[l];
        }
    }
    (p[0] + p[1]) + (p[2] + p[3]) + tail
}

/// Dot products of weight row `r` with the `A` activation rows `acts`,
/// `out[j] = w[r] . acts[j]`, with the steps of llama.cpp's AVX2
/// `ggml_vec_dot_q4_1_q8_1` for each pair: nibbles widened to 32 bytes,
/// `maddubs` (u8 x i8 pairs to i16, no saturation since 2 * 15 * 128 <
/// 32767), `madd` with ones to i32, then an f32 FMA with `d_w * d_x` per
/// block; the offset terms `m_w s_x` are summed after the loop.
///
/// The tile is what makes batching pay: each weight block is loaded and
/// unpacked once for `A` activation rows (up to 8), not once per row. The
/// `A` accumulators, the unpacked block and its scale, and the current
/// activation block fit the 16 ymm registers.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `r < w.n` and `acts.len() == A`, each
/// of `w.k / 32` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const A: usize>(w: &Q4_1Matrix, r: usize, acts: &[Q8_1Row]) -> [f32; A] {
    use std::arch::x86_64::*;
    let nb = w.k / QK;
    assert!(acts.len() == A && (r + 1) * nb <= w.qs.len());
    let wq = w.qs.as_ptr().add(r * nb);
    let wd = w.d.as_ptr().add(r * nb);
    let mut aq = [std::ptr::null::<Quants>(); A];
    let mut ad = [std::ptr::null::<f32>(); A];
    for j in 0..A {
        assert!(acts[j].qs.len() == nb && acts[j].d.len() == nb);
        aq[j] = acts[j].qs.as_ptr();
        ad[j] = acts[j].d.as_ptr();
    }
    let low4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); A];
    for b in 0..nb {
        // Values 0..16 (low nibbles) then 16..32 (high nibbles).
        let raw = _mm_load_si128(wq.add(b) as *const __m128i);
        let wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
        let dw = _mm256_set1_ps(*wd.add(b));
        for j in 0..A {
            let av = _mm256_load_si256(aq[j].add(b) as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*ad[j].add(b)));
            acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[j]);
        }
    }
    let wm = &w.m[r * nb..(r + 1) * nb];
    let mut out = [0f32; A];
    for j in 0..A {
        let v = acc[j];
        let sum4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
        let sum1 = _mm_add_ss(sum2, _mm_shuffle_ps(sum2, sum2, 1));
        out[j] = _mm_cvtss_f32(sum1) + dot_mins(wm, &acts[j].s);
    }
    out
}

/// [`tile_avx2`] over weight rows `rows` and every activation row, into
/// `out` laid out `[rows.len(), acts.len()]`: activation rows in tiles of
/// 8, the rest in tiles of 4, 2 and 1.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    w: &Q4_1Matrix,
    acts: &[Q8_1Row],
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let m = acts.len();
    // Activation tiles outside, weight rows inside: the tile's rows (8 x k
    // bytes) and the chunk's weight rows both stay in L1 however large `m`.
    let mut j = 0;
    while j < m {
        let a = match m - j {
            8.. => 8,
            4.. => 4,
            2.. => 2,
            _ => 1,
        };
        for (ri, r) in rows.clone().enumerate() {
            let o = &mut out[ri * m + j..ri * m + j + a];
            let tile = &acts[j..j + a];
            match a {
                8 => o.copy_from_slice(&tile_avx2::<8>(w, r, tile)),
                4 => o.copy_from_slice(&tile_avx2::<4>(w, r, tile)),
                2 => o.copy_from_slice(&tile_avx2::<2>(w, r, tile)),
                _ => o.copy_from_slice(&tile_avx2::<1>(w, r, tile)),
            }
        }
        j += a;
    }
}

/// Weight rows `rows` times every activation row, into `out` laid out
/// `[rows.len(), acts.len()]`: the tiled AVX2 kernel where the CPU has it,
/// else the portable loop one activation row at a time.
fn dot_block(w: &Q4_1Matrix, acts: &[Q8_1Row], rows: std::ops::Range<usize>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the kernel is compiled for;
        // `rows` are rows of `w`, and every activation row has `k` values.
        unsafe { block_avx2(w, acts, rows, out) };
        return;
    }
    let m = acts.len();
    let mut col = vec![0f32; rows.len()];
    for (i, a) in acts.iter().enumerate() {
        dot_rows_impl(w, a, rows.clone(), &mut col);
        for (j, v) in col.iter().enumerate() {
            out[j * m + i] = *v;
        }
    }
}

impl Q4_1Matrix {
    /// `y = x W^T` for `x` of `m` rows of `k` f32 values; `y` is `[m, n]`.
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let acts: Vec<Q8_1Row> = x.chunks_exact(k).map(quantize_q8_1).collect();
        // Work on the transposed output [n, m] so column chunks are contiguous.
        let mut out_t = vec![0f32; n * m];
        let chunk_rows = 16;
        let work = |(ci, chunk): (usize, &mut [f32])| {
            let r0 = ci * chunk_rows;
            dot_block(self, &acts, r0..r0 + chunk.len() / m, chunk);
        };
        if m * n * k >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1 {
            out_t
                .par_chunks_mut(chunk_rows * m)
                .enumerate()
                .for_each(work);
        } else {
            out_t.chunks_mut(chunk_rows * m).enumerate().for_each(work);
        }
        let mut out = vec![0f32; m * n];
        for (r, row) in out_t.chunks_exact(m).enumerate() {
            for (i, v) in row.iter().enumerate() {
                out[i * n + r] = *v;
            }
        }
        out
    }
}

impl CustomOp1 for Q4_1Matrix {
    fn name(&self) -> &'static str {
        "q4_1-matmul"
    }

    /// `x`: f32 `[..., k]` on the CPU; result `[..., n]`.
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("q4_1-matmul expects f32 input")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("q4_1-matmul expects a contiguous input")
        };
        let mut dims = layout.dims().to_vec();
        match dims.last_mut() {
            Some(last) if *last == self.k => *last = self.n,
            _ => candle_core::bail!("q4_1-matmul: input {dims:?} does not end in {}", self.k),
        }
        let x = &data[start..end];
        let out = self.matmul(x, x.len() / self.k);
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};

    /// Against f32 math on the dequantized weights, within the bound set by
    /// the activation rounding: each `x` is off by at most `0.5 d + 127 |d -
    /// f16(d)| < 0.57 d`, and `s` by f16 rounding of the block sum.
    /// Against candle's own (scalar) Q4_1 op, which quantizes the activations
    /// the same way but computes `s` as `f16(f16(sum) * f16(d))` (three f16
    /// roundings, where llama.cpp and this op round once): each block's
    /// `m * s` term may differ by up to about `3 * 2^-11 |m s|`.
    #[test]
    fn q4_1_matches_dequantized_and_candle() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (70, 192); // n not a multiple of the chunk size
                                // M = 64 crosses the parallel threshold; 3 and 16 tile remainders.
        for m in [1usize, 3, 16, 64] {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let q = QTensor::quantize(&w, GgmlDType::Q4_1)?;
            let ours = Q4_1Matrix::from_qtensor(&q)?;
            let deq = q.dequantize(&dev)?.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(ours.dequantize(), deq, "unpacking differs from candle's");

            let got = x.apply_op1_no_bwd(&ours)?;
            assert_eq!(got.dims(), &[m, n]);
            let got = got.to_vec2::<f32>()?;
            let xs = x.to_vec2::<f32>()?;
            for (i, xr) in xs.iter().enumerate() {
                let dx: Vec<f32> = xr
                    .chunks(QK)
                    .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0)
                    .collect();
                for o in 0..n {
                    let wr = &deq[o * k..(o + 1) * k];
                    let want: f32 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                    let bound: f32 =
                        (0..k).map(|j| wr[j].abs() * 0.57 * dx[j / QK]).sum::<f32>() + 1e-2;
                    let diff = (got[i][o] - want).abs();
                    assert!(
                        diff <= bound,
                        "m={m} row {i} out {o}: |diff| {diff} > {bound}"
                    );
                }
            }

            let candle = QMatMul::from_qtensor(q)?.forward(&x)?.to_vec2::<f32>()?;
            let nb = k / QK;
            for (i, xr) in xs.iter().enumerate() {
                let s = quantize_q8_1(xr).s;
                for o in 0..n {
                    let ms: f32 = (0..nb).map(|b| (ours.m[o * nb + b] * s[b]).abs()).sum();
                    let bound = 4.0 * ms / 2048.0 + 1e-3;
                    let (g, c) = (got[i][o], candle[i][o]);
                    assert!(
                        (g - c).abs() <= bound,
                        "ours {g} vs candle {c}, bound {bound}"
                    );
                }
            }
        }
        Ok(())
    }

    /// The tiled AVX2 kernel and the portable loop compute the same sums
    /// (up to f32 summation order), for every tile shape and remainder: 9
    /// weight rows (odd) and 1..=9 activation rows.
    #[test]
    fn avx2_matches_portable() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (9, 576);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let q = Q4_1Matrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_1)?)?;
        for m in 1..=9 {
            let x = Tensor::randn(0f32, 3.0, (m, k), &dev)?.to_vec2::<f32>()?;
            let acts: Vec<Q8_1Row> = x.iter().map(|r| quantize_q8_1(r)).collect();
            let mut dispatched = vec![0f32; n * m];
            dot_block(&q, &acts, 0..n, &mut dispatched);
            for (i, a) in acts.iter().enumerate() {
                let mut portable = vec![0f32; n];
                dot_rows_impl(&q, a, 0..n, &mut portable);
                for (r, p) in portable.iter().enumerate() {
                    let d = dispatched[r * m + i];
                    assert!(
                        (p - d).abs() <= 1e-4 * p.abs().max(1.0),
                        "m={m} act {i} row {r}: portable {p} vs dispatched {d}"
                    );
                }
            }
        }
        Ok(())
    }

    /// Timing probe, not a check: `cargo test -p hearth-models --lib --
    /// --ignored --nocapture q4_1_speed`. Best of 20 calls of the op alone
    /// (the rayon pool as configured), per activation row count.
    #[test]
    #[ignore]
    fn q4_1_speed() -> Result<()> {
        let dev = Device::Cpu;
        for (n, k) in [(1536usize, 576usize), (576, 1536)] {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let q = Q4_1Matrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_1)?)?;
            for m in [1usize, 4, 8, 16, 64] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let mut best = f64::MAX;
                for _ in 0..20 {
                    let t = std::time::Instant::now();
                    x.apply_op1_no_bwd(&q)?;
                    best = best.min(t.elapsed().as_secs_f64());
                }
                println!(
                    "[{n}x{k}] M={m:>2}: {:>8.1} us, {:>6.2} GMAC/s, {:>6.1} us/row",
                    best * 1e6,
                    (m * n * k) as f64 / best / 1e9,
                    best * 1e6 / m as f64
                );
            }
        }
        Ok(())
    }

    #[test]
    fn rejects_other_dtypes_and_shapes() -> Result<()> {
        let w = Tensor::randn(0f32, 1.0, (4, 64), &Device::Cpu)?;
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0)?;
        assert!(Q4_1Matrix::from_qtensor(&q8).is_err());
        let q = Q4_1Matrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_1)?)?;
        let bad = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu)?;
        assert!(bad.apply_op1_no_bwd(&q).is_err());
        Ok(())
    }
}
