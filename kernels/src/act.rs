//! Quantization of the activations to 8 bits per 32-value block.
//!
//! For each block of 32 values `x`, exactly as llama.cpp's Q8_0 / Q8_1
//! (`quantize_row_q8_1`): `d = max|x| / 127`, `q = round(x * 127 / max|x|)`
//! (ties to even) in -127..=127, `d` stored rounded to f16, and the block
//! sum `s = f16(d * sum(q))` for the weight formats with an offset
//! (`sum_j (d_w q_j + m) x_j ~ d_w d sum(q_w q) + m s`). Keeping llama.cpp's
//! f16 roundings (rather than f32 `d` and `s`) matters: with them the
//! SmolLM2 logits reproduce llama.cpp's fixture as closely as the old
//! bit-exact Q4_1 op did (max |dlogprob| 0.10 instead of 0.22 on one case).
//!
//! Error against f32 math on the dequantized weights: each value is off by
//! at most `d / 2 + 127 |d - f16(d)| <= 0.5625 d`, and `s` by at most
//! `2^-10 d |sum(q)|` from the dequantized values' sum, so `|y - y_ref| <=
//! sum_j 0.5625 |w_j| d(j) + sum_b |m_b| 2^-10 (sum_{j in b} |x_j| + 16
//! d_b)`. The K-quants use it too: finer than llama.cpp's Q8_K for them
//! (one f32 scale per 256 values).

use half::f16;

use crate::formats::{Q8, QK};

/// `m` activation rows of `nb` blocks; block `b` of row `i` at `i * nb + b`,
/// with its `d` and `s`.
pub(crate) struct Acts {
    pub nb: usize,
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// Values from which [`Acts::quantize`] splits the rows across the pool.
const PARALLEL_MIN_VALUES: usize = 1 << 15;

/// Quantizes whole blocks `x` into `qs`, `d` and `s` (one entry per block).
#[inline(always)]
fn quantize_blocks(x: &[f32], qs: &mut [Q8], d: &mut [f32], s: &mut [f32]) {
    for (((block, q), d), s) in x.chunks_exact(QK).zip(qs).zip(d).zip(s) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in q.0.iter_mut().zip(block) {
            *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
            sum += *q as i32;
        }
        (*d, *s) = scales(amax, sum);
    }
}

/// `d` and `s` of a block from its largest magnitude and quant sum, with
/// llama.cpp's f16 roundings.
#[inline(always)]
fn scales(amax: f32, sum: i32) -> (f32, f32) {
    let d = amax / 127.0;
    (
        f16::from_f32(d).to_f32(),
        f16::from_f32(d * sum as f32).to_f32(),
    )
}

/// [`quantize_blocks`] with AVX2: the same operations in the same order
/// (so the same bits for finite inputs), eight values per instruction.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_blocks_avx2(x: &[f32], qs: &mut [Q8], d: &mut [f32], s: &mut [f32]) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    // `packs` interleaves its inputs per 128-bit lane; this restores order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (((block, q), d), s) in x.chunks_exact(QK).zip(qs).zip(d).zip(s) {
        let p = block.as_ptr();
        // SAFETY: `block` holds 32 values; `q` 32 bytes.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let a = v.map(|v| _mm256_andnot_ps(sign, v));
            let a = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            let id = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            let i = v.map(|v| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v, id),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            let sum4 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let sum4 = _mm_add_epi32(
                _mm256_castsi256_si128(sum4),
                _mm256_extracti128_si256::<1>(sum4),
            );
            let sum2 = _mm_add_epi32(sum4, _mm_unpackhi_epi64(sum4, sum4));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum2, _mm_shuffle_epi32::<1>(sum2)));
            let b = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let b = _mm256_permutevar8x32_epi32(b, order);
            _mm256_storeu_si256(q.0.as_mut_ptr().cast(), b);
            (*d, *s) = scales(amax, sum);
        }
    }
}

/// Per-32 quantization of whole blocks, with AVX2 where present.
fn quantize_into(x: &[f32], qs: &mut [Q8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx2.is_available() {
        // SAFETY: `Isa::Avx2` is AVX2 + FMA + F16C, the features the
        // function is compiled for.
        return unsafe { quantize_blocks_avx2(x, qs, d, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.1") {
        /// With SSE4.1, whose `roundps` replaces a libm call per value.
        #[target_feature(enable = "sse4.1")]
        fn sse41(x: &[f32], qs: &mut [Q8], d: &mut [f32], s: &mut [f32]) {
            quantize_blocks(x, qs, d, s)
        }
        // SAFETY: the CPU supports the feature the function is compiled for.
        return unsafe { sse41(x, qs, d, s) };
    }
    quantize_blocks(x, qs, d, s)
}

impl Acts {
    /// Activation rows.
    #[inline(always)]
    pub(crate) fn rows(&self) -> usize {
        self.qs.len() / self.nb
    }

    /// `x`: rows of `k` values (`k % 32 == 0`), row major. Large inputs
    /// (prefill chunks) are split by rows across the pool.
    pub(crate) fn quantize(x: &[f32], k: usize) -> Acts {
        use rayon::prelude::*;
        let nb = k / QK;
        let blocks = x.len() / QK;
        let mut a = Acts {
            nb,
            qs: vec![Q8([0; QK]); blocks],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
        };
        let rows = blocks / nb.max(1);
        if x.len() >= PARALLEL_MIN_VALUES && rows > 1 && rayon::current_num_threads() > 1 {
            // Whole rows per task, at least a few thousand values each.
            let per = nb * (PARALLEL_MIN_VALUES / 8 / k).max(1);
            x.par_chunks(per * QK)
                .zip(a.qs.par_chunks_mut(per))
                .zip(a.d.par_chunks_mut(per))
                .zip(a.s.par_chunks_mut(per))
                .for_each(|(((x, qs), d), s)| quantize_into(x, qs, d, s));
        } else {
            quantize_into(x, &mut a.qs, &mut a.d, &mut a.s);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(x: &[f32]) -> (Vec<Q8>, Vec<f32>, Vec<f32>) {
        let n = x.len() / QK;
        (vec![Q8([0; QK]); n], vec![0.0; n], vec![0.0; n])
    }

    #[test]
    fn simd_quantization_is_bit_identical_to_the_loop() {
        // Pseudo-random values of varied scales, an all-zero block, and a
        // block whose maximum is 127 so that x.5 values are exact ties
        // (round half to even: 2.5 -> 2, -3.5 -> -4).
        let mut x: Vec<f32> = (0..32 * 40)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2654435761) >> 8;
                (h as f32 / (1 << 24) as f32 - 0.5) * (1 + i % 7) as f32 * 10f32.powi(i % 5 - 2)
            })
            .collect();
        x.extend([0.0; QK]);
        let mut ties = [0f32; QK];
        ties[0] = 127.0;
        for (j, t) in ties.iter_mut().enumerate().skip(1) {
            *t = (j as f32 - 16.0) + 0.5;
        }
        x.extend(ties);
        let (mut q1, mut d1, mut s1) = blocks(&x);
        quantize_blocks(&x, &mut q1, &mut d1, &mut s1);
        let last = q1.last().unwrap().0;
        assert_eq!(
            (last[1], last[2], last[14]),
            (-14, -14, -2),
            "ties go to even"
        );
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx2.is_available() {
            let (mut q2, mut d2, mut s2) = blocks(&x);
            // SAFETY: the features were checked just above.
            unsafe { quantize_blocks_avx2(&x, &mut q2, &mut d2, &mut s2) };
            for (b, (a, c)) in q1.iter().zip(&q2).enumerate() {
                assert_eq!(a.0, c.0, "block {b}");
            }
            assert_eq!(d1, d2);
            assert_eq!(s1, s2);
        }
    }

    #[test]
    fn rows_split_across_the_pool_give_the_serial_result() {
        let k = 576;
        let m = 100; // 57,600 values: over the parallel threshold
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let a = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| Acts::quantize(&x, k));
        let (mut q, mut d, mut s) = blocks(&x);
        quantize_blocks(&x, &mut q, &mut d, &mut s);
        assert_eq!(a.nb, k / QK);
        assert!(a.qs.iter().zip(&q).all(|(a, b)| a.0 == b.0));
        assert_eq!((a.d, a.s), (d, s));
    }
}
