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
//! d_b)`. For the K-quants this per-32 scheme is finer than llama.cpp's
//! Q8_K (one f32 scale per 256 values).

use half::f16;

use crate::formats::{Q8, QK};

/// `m` activation rows of `nb` blocks; block `b` of row `i` at `i * nb + b`.
/// Per-32 scaling ([`Acts::quantize`]): `d` and `s` per block, `bsum`
/// empty. Per-256 scaling for the K-quants ([`Acts::quantize_k`]): `d` per
/// 256 values (f32, not rounded), `s` empty, `bsum` = `sum(q)` per block.
pub(crate) struct Acts {
    pub nb: usize,
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub bsum: Vec<i32>,
}

#[inline(always)]
fn quantize_body(x: &[f32], nb: usize) -> Acts {
    let blocks = x.len() / QK;
    let mut a = Acts {
        nb,
        qs: Vec::with_capacity(blocks),
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
        bsum: Vec::new(),
    };
    for block in x.chunks_exact(QK) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut q = [0i8; QK];
        let mut sum = 0i32;
        for (q, &v) in q.iter_mut().zip(block) {
            *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
            sum += *q as i32;
        }
        a.d.push(f16::from_f32(d).to_f32());
        a.s.push(f16::from_f32(d * sum as f32).to_f32());
        a.qs.push(Q8(q));
    }
    a
}

/// [`quantize_body`] compiled with SSE4.1, whose `roundps` replaces a libm
/// call per value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
fn quantize_sse41(x: &[f32], nb: usize) -> Acts {
    quantize_body(x, nb)
}

/// llama.cpp's Q8_K: per 256 values `d = max|x| / 127` (f32), `q =
/// round(x / d)`, and the integer sum of each 32 quants. Each value is off
/// by at most `d / 2`; the K-quant sums are then exact integers.
#[inline(always)]
fn quantize_k_body(x: &[f32], nb: usize) -> Acts {
    let blocks = x.len() / QK;
    let mut a = Acts {
        nb,
        qs: Vec::with_capacity(blocks),
        d: Vec::with_capacity(blocks / 8),
        s: Vec::new(),
        bsum: Vec::with_capacity(blocks),
    };
    for sb in x.chunks_exact(8 * QK) {
        let amax = sb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        a.d.push(amax / 127.0);
        for block in sb.chunks_exact(QK) {
            let mut q = [0i8; QK];
            let mut sum = 0i32;
            for (q, &v) in q.iter_mut().zip(block) {
                *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
                sum += *q as i32;
            }
            a.bsum.push(sum);
            a.qs.push(Q8(q));
        }
    }
    a
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
fn quantize_k_sse41(x: &[f32], nb: usize) -> Acts {
    quantize_k_body(x, nb)
}

impl Acts {
    /// Per-256 quantization for the K-quants; `k % 256 == 0`.
    pub(crate) fn quantize_k(x: &[f32], k: usize) -> Acts {
        let nb = k / QK;
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("sse4.1") {
            // SAFETY: the CPU supports the feature the function is compiled for.
            return unsafe { quantize_k_sse41(x, nb) };
        }
        quantize_k_body(x, nb)
    }

    /// `x`: rows of `k` values (`k % 32 == 0`), row major.
    pub(crate) fn quantize(x: &[f32], k: usize) -> Acts {
        let nb = k / QK;
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("sse4.1") {
            // SAFETY: the CPU supports the feature the function is compiled for.
            return unsafe { quantize_sse41(x, nb) };
        }
        quantize_body(x, nb)
    }
}
