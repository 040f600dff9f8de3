//! Small numeric helpers for the slice code of the models, written so that
//! the compiler vectorises them, and a switch that compiles a hot loop for
//! AVX2 + FMA when the CPU has them.
//!
//! The crate is built for the baseline x86-64 (SSE2), so plain loops over
//! slices get 4-wide vectors, no FMA, and `f32::exp` is a libm call per
//! value. A hot loop is an `#[inline(always)]` body with a `const FMA:
//! bool` parameter, called from a small `#[target_feature(enable =
//! "avx2,fma,f16c")]` function where [`has_fma`] says so (the body is then
//! inlined there and vectorised 8-wide), else with `FMA = false`; [`madd`]
//! is a fused multiply-add in the first and a plain multiply and add in the
//! second (without the instruction `mul_add` is a slow library call).

pub use hearth_kernels::math::{erf, exp_consts, exp_with, madd};

/// `e^x` in f32 without a library call (so loops over it vectorise):
/// `2^n e^r` with `n = round(x / ln 2)`, `|r| <= ln 2 / 2`, and a degree-6
/// polynomial for `e^r` (Cephes' `expf` coefficients). Relative error
/// below 2e-7 over the clamped range; `x` is clamped to `[-87, 88]`, so
/// very negative inputs (and `-inf`) give about 1.6e-38 rather than 0.
/// The decoder keeps this unfused form rather than [`exp_with`]'s fused
/// one: its greedy tokens are compared with llama.cpp's, and some of those
/// choices are close enough for a last bit to flip them.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_with::<false>(x)
}

/// Folds `x` into 16 interleaved accumulators (`step`), then merges them
/// pairwise (8 + 8, 4 + 4, 2 + 2, 1 + 1) and the tail's own fold
/// (`merge`): the 16 chains are independent, so the loop vectorises where
/// a single running value (f32 addition or `max` is not reassociated by
/// the compiler) would be one serial chain, and the merge is 4 dependent
/// vector operations, not 16 scalar ones (a softmax over a short
/// sequence's 32 scores spent most of its time there).
#[inline(always)]
fn fold16(
    x: &[f32],
    init: f32,
    step: impl Fn(f32, f32) -> f32,
    merge: impl Fn(f32, f32) -> f32,
) -> f32 {
    let mut acc = [init; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = step(*a, v);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |a, &v| step(a, v));
    let mut width = 16;
    while width > 1 {
        width /= 2;
        let (low, high) = acc.split_at_mut(width);
        for (a, &b) in low.iter_mut().zip(&high[..width]) {
            *a = merge(*a, b);
        }
    }
    merge(acc[0], tail)
}

/// `sum f(x_i)`, over 16 interleaved partial sums ([`fold16`]).
#[inline(always)]
pub fn sum_by(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    fold16(x, 0.0, |a, v| a + f(v), |a, b| a + b)
}

/// `sum a_i b_i` over 16 interleaved partial sums (so it vectorises; the
/// order, and so the bits, depend only on the length), fused when `FMA`.
#[inline(always)]
pub fn dot16<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let (mut ca, mut cb) = (a.chunks_exact(16), b.chunks_exact(16));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            acc[i] = madd::<FMA>(x[i], y[i], acc[i]);
        }
    }
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .fold(0.0, |s, (x, y)| madd::<FMA>(*x, *y, s));
    acc.iter().sum::<f32>() + tail
}

/// The largest of `x` (`-inf` when empty), over 16 interleaved partial
/// maxima ([`fold16`]). NaNs are skipped, as by `f32::max`.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    fold16(x, f32::NEG_INFINITY, f32::max, f32::max)
}

/// Exact (erf) GELU in place, `x (1 + erf(x / sqrt 2)) / 2` with [`erf`],
/// compiled for AVX2 + FMA where present.
pub(crate) fn gelu_erf_inplace(x: &mut [f32]) {
    #[inline(always)]
    fn body<const FMA: bool>(x: &mut [f32]) {
        let gelu = |y: &mut f32| *y = hearth_kernels::math::gelu_erf::<FMA>(*y);
        // Two vectors' worth per step: each value is a long chain of
        // dependent operations, and two independent chains keep the
        // multiply-add units busier than one.
        let mut chunks = x.chunks_exact_mut(16);
        for c in &mut chunks {
            c.iter_mut().for_each(gelu);
        }
        chunks.into_remainder().iter_mut().for_each(gelu);
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(x: &mut [f32]) {
            body::<true>(x)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(x) };
    }
    body::<false>(x)
}

/// LayerNorm of every row of `x` (rows of `w.len()`) in place:
/// `(v - mean) / sqrt(var + eps) * w + b`, mean and variance over 16
/// partial sums ([`sum_by`]); compiled for AVX2 + FMA where present (the
/// same operations in the same order either way, so the same bits).
pub(crate) fn layer_norm_rows(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    #[inline(always)]
    fn body(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
        let h = w.len();
        for row in x.chunks_exact_mut(h) {
            let mean = sum_by(row, |v| v) / h as f32;
            let var = sum_by(row, |v| (v - mean) * (v - mean)) / h as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * inv * w + b;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
            body(x, w, b, eps)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(x, w, b, eps) };
    }
    body(x, w, b, eps)
}

/// `dst[i] = a[i] + b[i]` over the rows of `dst` (rows of `b.len()`; `a`
/// as long as `dst`), or `dst[i] = b[i]` without `a`: a bias, with or
/// without a residual, written into an uninitialised buffer. Compiled for
/// AVX2 where present.
pub(crate) fn write_rows_plus(
    dst: &mut [std::mem::MaybeUninit<f32>],
    a: Option<&[f32]>,
    b: &[f32],
) {
    #[inline(always)]
    fn body(dst: &mut [std::mem::MaybeUninit<f32>], a: Option<&[f32]>, b: &[f32]) {
        let h = b.len();
        match a {
            Some(a) => {
                for (row, a) in dst.chunks_exact_mut(h).zip(a.chunks_exact(h)) {
                    for ((d, a), b) in row.iter_mut().zip(a).zip(b) {
                        d.write(a + b);
                    }
                }
            }
            None => {
                for row in dst.chunks_exact_mut(h) {
                    for (d, b) in row.iter_mut().zip(b) {
                        d.write(*b);
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(dst: &mut [std::mem::MaybeUninit<f32>], a: Option<&[f32]>, b: &[f32]) {
            body(dst, a, b)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(dst, a, b) };
    }
    body(dst, a, b)
}

/// `g = silu(g) * u` (`silu(x) = x / (1 + e^-x)`) with [`exp`], compiled
/// for AVX2 + FMA where present.
pub(crate) fn silu_mul_inplace(g: &mut [f32], u: &[f32]) {
    #[inline(always)]
    fn body(g: &mut [f32], u: &[f32]) {
        for (g, &u) in g.iter_mut().zip(u) {
            *g = *g / (1.0 + exp(-*g)) * u;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(g: &mut [f32], u: &[f32]) {
            body(g, u)
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(g, u) };
    }
    body(g, u)
}

/// IEEE half-precision bits to f32 (`dst.len() == src.len()`), eight at a
/// time with F16C where the CPU has it.
pub(crate) fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(src: &[u16], dst: &mut [f32]) {
            use std::arch::x86_64::*;
            let n8 = src.len() / 8 * 8;
            for i in (0..n8).step_by(8) {
                // SAFETY: `i + 8 <= len` for both slices (equal lengths).
                unsafe {
                    let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                }
            }
            for (d, &s) in dst[n8..].iter_mut().zip(&src[n8..]) {
                *d = half::f16::from_bits(s).to_f32();
            }
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(src, dst) };
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(s).to_f32();
    }
}

/// f32 to IEEE half-precision bits, rounding to nearest even
/// (`dst.len() == src.len()`), eight at a time with F16C where present.
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn fast(src: &[f32], dst: &mut [u16]) {
            use std::arch::x86_64::*;
            let n8 = src.len() / 8 * 8;
            for i in (0..n8).step_by(8) {
                // SAFETY: `i + 8 <= len` for both slices (equal lengths).
                unsafe {
                    let x = _mm256_loadu_ps(src.as_ptr().add(i));
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                    _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
                }
            }
            for (d, &s) in dst[n8..].iter_mut().zip(&src[n8..]) {
                *d = half::f16::from_f32(s).to_bits();
            }
        }
        // SAFETY: the CPU has the features `fast` is compiled for.
        return unsafe { fast(src, dst) };
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s).to_bits();
    }
}

/// Rounds every value to the nearest half-precision value, in place.
pub(crate) fn round_f16(x: &mut [f32]) {
    let mut h = [0u16; 64];
    for c in x.chunks_mut(64) {
        let h = &mut h[..c.len()];
        f32_to_f16(c, h);
        f16_to_f32(h, c);
    }
}

/// Whether this CPU has AVX2, FMA and F16C.
#[inline]
pub fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_match_the_half_crate() {
        // Ordinary values, ties, subnormals, overflow, infinities, NaN, and
        // a length that leaves a tail after the 8-wide loop.
        let mut xs: Vec<f32> = (0..203)
            .map(|i| (i as f32 - 100.0) * 0.37e-3 * (i as f32))
            .collect();
        xs.extend([
            1e-7,
            -3e-8,
            65504.0,
            65520.0,
            1e6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + 1.0 / 2048.0,
        ]);
        let want: Vec<u16> = xs
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let mut got = vec![0u16; xs.len()];
        f32_to_f16(&xs, &mut got);
        assert_eq!(got, want);
        let mut back = vec![0f32; xs.len()];
        f16_to_f32(&got, &mut back);
        let want_back: Vec<f32> = want
            .iter()
            .map(|&h| half::f16::from_bits(h).to_f32())
            .collect();
        assert_eq!(back, want_back);
        let mut r = xs.clone();
        round_f16(&mut r);
        assert_eq!(r, want_back);
        let mut nan = [f32::NAN; 9];
        round_f16(&mut nan);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
        // The ends of the clamp: the exponent field stays in range (1..=254).
        assert_eq!(exp(1000.0), exp(88.0));
        assert!(exp(88.0).is_finite() && exp(88.0) > 1.6e38);
        assert!(exp(-87.0) > 0.0 && exp(-87.0) < 1.7e-38);
    }

    #[test]
    fn sum_by_matches_an_f64_sum() {
        for n in [0, 1, 15, 16, 17, 384, 1000] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let want: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let got = sum_by(&x, |v| v * v) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1.0),
                "{n}: {got} vs {want}"
            );
            let plain: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((sum_by(&x, |v| v) as f64 - plain).abs() < 1e-3, "{n}");
        }
    }

    #[test]
    fn max_matches_a_fold() {
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        for n in [1, 15, 16, 17, 40] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let want = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            assert_eq!(max(&x), want, "{n}");
            let mut y = x.clone();
            y[n / 2] = f32::NAN;
            y[n - 1] = 100.0;
            assert_eq!(max(&y), 100.0, "{n}");
        }
    }

    #[test]
    fn erf_is_within_1e6_of_f64() {
        fn check<const FMA: bool>() {
            let mut worst = 0f64;
            let mut x = -6.0f32;
            while x < 6.0 {
                let want = candle_core::cpu::erf::erf_f64(x as f64);
                worst = worst.max((erf::<FMA>(x) as f64 - want).abs());
                x += 0.00731;
            }
            assert!(worst < 1e-6, "FMA {FMA}: worst absolute error {worst}");
            assert!(erf::<FMA>(0.0).abs() < 1e-6, "erf(0) = {}", erf::<FMA>(0.0));
            assert_eq!(erf::<FMA>(-2.0), -erf::<FMA>(2.0));
        }
        check::<false>();
        check::<true>();
    }

    #[test]
    fn exp_with_fma_is_within_3e7_relative() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_with::<true>(x) as f64;
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
    }
}
