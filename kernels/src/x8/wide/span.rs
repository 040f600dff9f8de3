//! The 512-bit tiles of the layouts summed per span of eight blocks
//! (Q3_K, Q2_K, and Q6_K in prompt steps): integer sums over a whole
//! super-block, then the float operations once per span.

use std::arch::x86_64::*;

use super::{prefetch_next_pair, starts, Sums, Unpacked};
use crate::act::{tiled_at, Acts};
use crate::x8::{Group8, G, SPAN_BLOCKS};

/// [`super::tile_unpacked`] for the layouts summed per span (Q3_K's
/// [`Sums::All127`], Q2_K's [`Sums::Mins16`], Q6_K's [`Sums::Span6`]):
/// each row's integer sums run over a whole span of eight blocks (from
/// `acts.start127` for Q3_K's bias; from zero for Q2_K, whose mins meet
/// the half sums by `vpdpwssd`; Q6_K's from each block's half sums, each
/// from its bias correction, times their scales), then take the 256-bit
/// tile's float operations once per span, so the same bits.
///
/// # Safety
/// As [`super::tile_unpacked`]; the activations have spans of 256.
#[inline(always)]
pub(super) unsafe fn tile_span<W: Group8, const A: usize, const STREAM: bool, const TILED: bool>(
    w: &W,
    g: usize,
    blocks: &[Unpacked],
    acts: &Acts,
    a: usize,
) -> [__m512; A] {
    let nb = acts.nb;
    assert!((STREAM || blocks.len() == nb) && (a + A) * nb <= acts.qs.len() && acts.span == 256);
    let all127 = W::SUMS == Sums::All127;
    let six = W::SUMS == Sums::Span6;
    // As in `tile_unpacked`, per block (`$per` blocks per row) or span.
    macro_rules! ix {
        ($j:expr, $b:expr) => {
            ix!($j, $b, nb)
        };
        ($j:expr, $b:expr, $per:expr) => {
            if TILED {
                tiled_at($per, a, A, $j, $b)
            } else {
                (a + $j) * $per + $b
            }
        };
    }
    let mut acc = [_mm512_setzero_ps(); A];
    let mut s = [_mm512_setzero_si512(); A];
    let mut s2 = [_mm512_setzero_si512(); A];
    for b in 0..nb {
        if a == 0 {
            prefetch_next_pair(w, g, b);
        }
        let here;
        let u = unpacked!(w, g, nb, blocks, b, here);
        if all127 && b % SPAN_BLOCKS == 0 {
            for (j, s) in s.iter_mut().enumerate() {
                let t = ix!(j, b / SPAN_BLOCKS, nb / SPAN_BLOCKS);
                *s = _mm512_set1_epi32(*acts.start127.get_unchecked(t));
            }
        }
        // Unrolled over the rows, as in `tile_unpacked`; each weight
        // register serves every row before the next is read.
        macro_rules! rows {
            ($s:ident, $v:expr; $($j:literal)*) => {$(
                if $j < A {
                    let x = acts.qs.as_ptr().add(ix!($j, b)) as *const i32;
                    let xv = _mm512_set1_epi32(x.add($v).read());
                    $s[$j] = _mm512_dpbusd_epi32($s[$j], u.w[$v], xv);
                }
            )*};
        }
        if six {
            // Each half's sum from its bias correction, times its scale
            // into the span's sum (`s`; the products are exact).
            let mut h0 = [_mm512_setzero_si512(); A];
            let mut h1 = [_mm512_setzero_si512(); A];
            for j in 0..A {
                [h0[j], h1[j]] = starts::<W>(acts, ix!(j, b));
            }
            for v in 0..G / 2 {
                rows!(h0, v; 0 1 2 3 4 5 6 7);
            }
            for v in G / 2..G {
                rows!(h1, v; 0 1 2 3 4 5 6 7);
            }
            let pairs = _mm512_castps_si512(u.m);
            let sc0 = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pairs));
            let sc1 = _mm512_srai_epi32::<16>(pairs);
            for j in 0..A {
                let t = _mm512_add_epi32(
                    _mm512_mullo_epi32(h0[j], sc0),
                    _mm512_mullo_epi32(h1[j], sc1),
                );
                s[j] = _mm512_add_epi32(s[j], t);
            }
        } else {
            for v in 0..G {
                rows!(s, v; 0 1 2 3 4 5 6 7);
            }
        }
        if !all127 && !six {
            let mins = w.mins2(g * nb + b, (g + 1) * nb + b);
            for (j, s2) in s2.iter_mut().enumerate() {
                let halves = (*acts.bias.as_ptr().add(ix!(j, b))).halves;
                *s2 = _mm512_dpwssd_epi32(*s2, mins, _mm512_set1_epi32(halves));
            }
        }
        if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
            for j in 0..A {
                let dx = _mm512_set1_ps(*acts.d.get_unchecked(ix!(j, b)));
                acc[j] = if all127 || six {
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), _mm512_mul_ps(u.d, dx), acc[j])
                } else {
                    // As the 256-bit tile: `(d S1 - dmin S2) d_x`.
                    let t = _mm512_fmadd_ps(
                        u.m,
                        _mm512_cvtepi32_ps(s2[j]),
                        _mm512_mul_ps(u.d, _mm512_cvtepi32_ps(s[j])),
                    );
                    _mm512_fmadd_ps(t, dx, acc[j])
                };
                s[j] = _mm512_setzero_si512();
                s2[j] = _mm512_setzero_si512();
            }
        }
    }
    if all127 {
        // The 256-bit signed tiles add their (zero) offsets' sums last.
        // A loop: `map`'s closure is compiled without AVX-512, so the add
        // became a call per register.
        for acc in &mut acc {
            *acc = _mm512_add_ps(*acc, _mm512_setzero_ps());
        }
    }
    acc
}

/// [`tile_span`] for Q3_K ([`Sums::All127`]) on two group pairs at once,
/// `g, g + 1` (unpacked in `b0`) and `g + 2, g + 3` (in `b1`), with the
/// activation rows regrouped by tiles: each broadcast activation word
/// meets both pairs' weights, so a block's tile of 8 rows takes 64 such
/// loads for 128 `vpdpbusd` instead of 64 for 64. Each pair's lanes get
/// [`tile_span`]'s integer sums and float operations in the same order, so
/// the same bits.
///
/// # Safety
/// AVX-512 F/VNNI; groups `g..g + 4` exist; `b0` and `b1` hold every
/// block of their pairs; the activation rows exist, regrouped by tiles,
/// with spans of 256.
#[inline(always)]
pub(super) unsafe fn tile_span_quad<W: Group8, const A: usize>(
    w: &W,
    g: usize,
    b0: &[Unpacked],
    b1: &[Unpacked],
    acts: &Acts,
    a: usize,
) -> [[__m512; A]; 2] {
    let nb = acts.nb;
    assert!(
        W::SUMS == Sums::All127
            && acts.tiled
            && acts.span == 256
            && b0.len() == nb
            && b1.len() == nb
            && (a + A) * nb <= acts.qs.len()
    );
    let mut acc = [[_mm512_setzero_ps(); A]; 2];
    let mut s0 = [_mm512_setzero_si512(); A];
    let mut s1 = [_mm512_setzero_si512(); A];
    for b in 0..nb {
        if a == 0 {
            // The next chunk's two pairs.
            prefetch_next_pair(w, g + 2, b);
            prefetch_next_pair(w, g + 4, b);
        }
        let (u0, u1) = (b0.get_unchecked(b), b1.get_unchecked(b));
        if b % SPAN_BLOCKS == 0 {
            for j in 0..A {
                let t = tiled_at(nb / SPAN_BLOCKS, a, A, j, b / SPAN_BLOCKS);
                let start = _mm512_set1_epi32(*acts.start127.get_unchecked(t));
                s0[j] = start;
                s1[j] = start;
            }
        }
        macro_rules! rows {
            ($v:expr; $($j:literal)*) => {$(
                if $j < A {
                    let x = acts.qs.as_ptr().add(tiled_at(nb, a, A, $j, b)) as *const i32;
                    let xv = _mm512_set1_epi32(x.add($v).read());
                    s0[$j] = _mm512_dpbusd_epi32(s0[$j], u0.w[$v], xv);
                    s1[$j] = _mm512_dpbusd_epi32(s1[$j], u1.w[$v], xv);
                }
            )*};
        }
        for v in 0..G {
            rows!(v; 0 1 2 3 4 5 6 7);
        }
        if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
            for j in 0..A {
                let dx = _mm512_set1_ps(*acts.d.get_unchecked(tiled_at(nb, a, A, j, b)));
                let [acc0, acc1] = &mut acc;
                acc0[j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[j]), _mm512_mul_ps(u0.d, dx), acc0[j]);
                acc1[j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[j]), _mm512_mul_ps(u1.d, dx), acc1[j]);
            }
        }
    }
    // As `tile_span`: the 256-bit tiles add their (zero) offsets' sums last.
    for acc in acc.iter_mut().flatten() {
        *acc = _mm512_add_ps(*acc, _mm512_setzero_ps());
    }
    acc
}
