//! The exact GELU on 16 lanes, for the epilogues of the 512-bit tile
//! kernels: [`super::avx2::gelu_erf`]'s operations in the same order on
//! twice the lanes, so the same bits. Only AVX-512F instructions (the
//! sign-bit operations go through the integer forms, which need no
//! AVX-512DQ).

use std::arch::x86_64::*;

use crate::math::{erf_consts, exp_consts};

/// Lane-wise `a ^ b`, `!a & b`, `a & b` and `a | b` on the bits.
#[inline(always)]
unsafe fn bits(a: __m512, b: __m512, op: Bits) -> __m512 {
    let (a, b) = (_mm512_castps_si512(a), _mm512_castps_si512(b));
    _mm512_castsi512_ps(match op {
        Bits::Xor => _mm512_xor_si512(a, b),
        Bits::AndNot => _mm512_andnot_si512(a, b),
        Bits::And => _mm512_and_si512(a, b),
        Bits::Or => _mm512_or_si512(a, b),
    })
}

#[derive(Clone, Copy)]
enum Bits {
    Xor,
    AndNot,
    And,
    Or,
}

/// [`crate::math::exp_with`]`::<true>` on 16 lanes.
#[inline(always)]
unsafe fn exp(x: __m512) -> __m512 {
    use exp_consts::*;
    let set = _mm512_set1_ps;
    let x = _mm512_min_ps(_mm512_max_ps(x, set(-87.0)), set(88.0));
    const FLOOR: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
    let n = _mm512_roundscale_ps::<FLOOR>(_mm512_fmadd_ps(x, set(LOG2E), set(0.5)));
    let neg_n = bits(n, set(-0.0), Bits::Xor);
    let r = _mm512_fmadd_ps(neg_n, set(C2), _mm512_fmadd_ps(neg_n, set(C1), x));
    let mut p = set(P0);
    for c in P {
        p = _mm512_fmadd_ps(p, r, set(c));
    }
    let e_r = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), set(1.0));
    let two_n = _mm512_slli_epi32::<23>(_mm512_castps_si512(_mm512_add_ps(n, set(127.0 + MAGIC))));
    _mm512_mul_ps(e_r, _mm512_castsi512_ps(two_n))
}

/// [`crate::math::gelu_erf`]`::<true>` on 16 lanes.
#[inline(always)]
pub(crate) unsafe fn gelu_erf(x: __m512) -> __m512 {
    use erf_consts::*;
    let set = _mm512_set1_ps;
    let sign = set(-0.0);
    let z = _mm512_mul_ps(x, set(std::f32::consts::FRAC_1_SQRT_2));
    let a = bits(sign, z, Bits::AndNot);
    let t = _mm512_div_ps(set(1.0), _mm512_fmadd_ps(set(P), a, set(1.0)));
    let mut poly = set(A5);
    for c in A {
        poly = _mm512_fmadd_ps(poly, t, set(c));
    }
    let e = exp(_mm512_mul_ps(bits(a, sign, Bits::Xor), a));
    let neg = bits(_mm512_mul_ps(poly, t), sign, Bits::Xor);
    let y = _mm512_fmadd_ps(neg, e, set(1.0));
    let erf = bits(
        bits(sign, y, Bits::AndNot),
        bits(sign, z, Bits::And),
        Bits::Or,
    );
    _mm512_mul_ps(_mm512_mul_ps(set(0.5), x), _mm512_add_ps(set(1.0), erf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit for bit the scalar GELU's (and so the 8-lane one's) on values
    /// across its range, the clamps of `exp` and the signed zeros.
    #[test]
    fn matches_the_scalar_gelu_bit_for_bit() {
        if !crate::Isa::Avx512.is_available() {
            eprintln!("no AVX-512 on this CPU: 16-lane GELU not run");
            return;
        }
        let mut xs: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.0037).collect();
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 13.5, -13.5, 40.0, -40.0, 1e6, -1e6,
        ]);
        xs.extend(
            crate::dense_test_util::seeded(1000, 3)
                .iter()
                .map(|v| v * 9.0),
        );
        while !xs.len().is_multiple_of(16) {
            xs.push(0.5);
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn run(x: &[f32], out: &mut [f32]) {
            let v = gelu_erf(_mm512_loadu_ps(x.as_ptr()));
            _mm512_storeu_ps(out.as_mut_ptr(), v);
        }
        for chunk in xs.chunks(16) {
            let mut got = [0f32; 16];
            // SAFETY: the CPU has AVX-512F (checked above); 16 values each.
            unsafe { run(chunk, &mut got) };
            for (g, &x) in got.iter().zip(chunk) {
                let want = crate::math::gelu_erf::<true>(x);
                assert_eq!(g.to_bits(), want.to_bits(), "gelu({x}): {g} vs {want}");
            }
        }
    }
}
