//! Quantization of the activations to 8 bits per 32-value block.
//!
//! For each block of 32 values `x`: `d = max|x| / 127` (kept in f32, unlike
//! llama.cpp's f16), `q = round(x / d)` in -127..=127, and the block sum
//! `s = d * sum(q)` for the weight formats with an offset (`sum_j (d_w q_j +
//! m) x_j ~ d_w d sum(q_w q) + m s`). Each value is then off by at most
//! `d / 2` (plus f32 rounding), which is the whole error of the matmul
//! against f32 math on the dequantized weights: `|y - y_ref| <= sum_j |w_j|
//! d(j) / 2`. This is finer than llama.cpp's Q8_K (one scale per 256) for
//! the K-quants.

use crate::formats::{Q8, QK};

/// `m` activation rows of `nb` blocks; block `b` of row `i` at `i * nb + b`.
pub(crate) struct Acts {
    pub nb: usize,
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

#[inline(always)]
fn quantize_body(x: &[f32], nb: usize) -> Acts {
    let blocks = x.len() / QK;
    let mut a = Acts {
        nb,
        qs: Vec::with_capacity(blocks),
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
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
        a.d.push(d);
        a.s.push(d * sum as f32);
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

impl Acts {
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
