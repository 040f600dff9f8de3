//! Scalar `e^x` and `erf` in f32 without library calls, shared by the
//! models' slice code (which the compiler vectorises) and the dense f32
//! kernel's GELU (the same operations on AVX2 registers, so the same
//! bits).
//!
//! A loop body with a `const FMA: bool` parameter is compiled twice: with
//! fused multiply-adds where the caller enables FMA, and with plain
//! multiplies and adds elsewhere ([`madd`]; without the instruction
//! `mul_add` is a slow library call).

/// `a * b + c`, fused when `FMA`.
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `e^x` in f32: `2^n e^r` with `n = round(x / ln 2)`, `|r| <= ln 2 / 2`,
/// and a degree-6 polynomial for `e^r` (Cephes' `expf` coefficients),
/// with fused multiply-adds when `FMA` (last-bit differences from the
/// unfused form). Relative error below 2e-7 over the clamped range; `x` is
/// clamped to `[-87, 88]`, so very negative inputs (and `-inf`) give about
/// 1.6e-38 rather than 0.
#[inline(always)]
pub fn exp_with<const FMA: bool>(x: f32) -> f32 {
    use exp_consts::*;
    let x = x.clamp(-87.0, 88.0);
    let n = (madd::<FMA>(x, LOG2E, 0.5)).floor();
    let r = madd::<FMA>(-n, C2, madd::<FMA>(-n, C1, x));
    let mut p = P0;
    for c in P {
        p = madd::<FMA>(p, r, c);
    }
    let e_r = madd::<FMA>(p * r, r, r) + 1.0;
    // 2^n from the bits of `n + 127` placed in the exponent field. `n + 127`
    // is an integer in 1..=254 (from the clamp), so adding 1.5 * 2^23 puts
    // it in the low mantissa bits exactly, and the shift drops the rest:
    // the same bits as `(n as i32 + 127) << 23`, without the saturating
    // float-to-int conversion, which the compiler does not vectorise.
    e_r * f32::from_bits((n + (127.0 + MAGIC)).to_bits() << 23)
}

/// The constants of [`exp_with`] (also of the vector versions): `ln 2`
/// split in two (`C1 - C2`), the polynomial's coefficients from the
/// highest, and the exponent field's rounding constant.
pub mod exp_consts {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const C1: f32 = 0.693_359_4;
    pub const C2: f32 = -2.121_944_4e-4;
    pub const P0: f32 = 1.987_569_1e-4;
    pub const P: [f32; 5] = [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    pub const MAGIC: f32 = 12_582_912.0;
}

/// The constants of [`erf`]: Abramowitz and Stegun 7.1.26's `p` and its
/// polynomial's coefficients from the highest (`a5` .. `a1`).
pub mod erf_consts {
    pub const P: f32 = 0.327_591_1;
    pub const A5: f32 = 1.061_405_4;
    pub const A: [f32; 4] = [-1.453_152_1, 1.421_413_7, -0.284_496_74, 0.254_829_6];
}

/// `erf(x)` in f32: Abramowitz and Stegun 7.1.26, `1 - (a1 t + ... + a5
/// t^5) e^(-x^2)` with `t = 1 / (1 + p |x|)`, odd in `x`; absolute error
/// below 1e-6 (1.5e-7 for the formula, the rest f32 rounding).
#[inline(always)]
pub fn erf<const FMA: bool>(x: f32) -> f32 {
    use erf_consts::*;
    let a = x.abs();
    let t = 1.0 / madd::<FMA>(P, a, 1.0);
    let mut poly = A5;
    for c in A {
        poly = madd::<FMA>(poly, t, c);
    }
    let y = madd::<FMA>(-(poly * t), exp_with::<FMA>(-a * a), 1.0);
    y.copysign(x)
}

/// Exact (erf) GELU of one value, `x (1 + erf(x / sqrt 2)) / 2` with
/// [`erf`].
#[inline(always)]
pub fn gelu_erf<const FMA: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf::<FMA>(x * std::f32::consts::FRAC_1_SQRT_2))
}
