//! Quantization of the activations to 8 bits per 32-value block, with one
//! scale per block or per 256-value span.
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
//! With a span of 256 ([`crate::Format::activation_span`]: Q2_K and Q3_K
//! weights, Q4_K, Q5_K and Q6_K on CPUs without AVX-512 VNNI, and Q4_K
//! and Q5_K in prompt steps on CPUs with it), `max|x|` is taken over the
//! whole span and `d` (f32, as llama.cpp's Q8_K keeps it) is shared by its
//! eight blocks, whose fields stay per block (`s` is then the block's
//! quant sum, unscaled); the kernels apply `d` once per span.
//!
//! For the 512-bit prefill kernels, [`Acts::quantize_tiled`] lays the
//! same blocks out with the rows regrouped by the kernels' tiles of eight
//! rows, so that a tile's rows read each block from one place.
//!
//! Error against f32 math on the dequantized weights: each value is off by
//! at most `d / 2 + 127 |d - f16(d)| <= 0.5625 d`, and `s` by at most
//! `2^-10 d |sum(q)|` from the dequantized values' sum, so `|y - y_ref| <=
//! sum_j 0.5625 |w_j| d(j) + sum_b |m_b| 2^-10 (sum_{j in b} |x_j| + 16
//! d_b)`. Q4_K, Q5_K and Q6_K in decode steps on CPUs with AVX-512 VNNI
//! use 32-value scales too: finer than llama.cpp's Q8_K for them (one f32
//! scale per 256 values).

use half::f16;

use crate::formats::{Q8, QK};

/// `m` activation rows of `nb` blocks; block `b` of row `i` at `i * nb + b`,
/// with its `d`, `s` and [`Bias`].
pub(crate) struct Acts {
    pub nb: usize,
    /// Values per scale: 32, or 256 (eight blocks, with the same `d`).
    pub span: usize,
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    /// `d` times the block's quant sum (f16-rounded) with a span of 32;
    /// the quant sum alone with a span of 256.
    pub s: Vec<f32>,
    pub bias: Vec<Bias>,
    /// With a span of 256, `-127` times the sum of each span's quantized
    /// values (span `t` at `t`: blocks `8 t..8 t + 8`), where the 512-bit
    /// Q3_K sums start; else empty.
    pub start127: Vec<i32>,
    /// With a span of 256, the sums of the quantized values of each two
    /// consecutive blocks of a row as 16-bit integers in one word (block
    /// `2 p` in the low half; each at most `32 * 127` in magnitude): pair
    /// `p` of row `i` at `i * nb / 2 + p`. The Q4_K and Q5_K mins of the
    /// 256-bit tiles multiply them (`vpmaddwd`); else empty (also with the
    /// rows regrouped by tiles, which only the 512-bit kernels read).
    pub pairs: Vec<i32>,
    /// Whether the rows are regrouped by tiles ([`Acts::quantize_tiled`]).
    pub tiled: bool,
    /// Whether those tiles have 16 rows while 16 are left (the AMX tiles'
    /// height), then [`crate::x8::tile_rows`]'s sizes.
    pub tiles16: bool,
}

/// Where element `e` (of `per_row` per row) of row `a + j` sits when the
/// rows are regrouped by tiles ([`Acts::quantize_tiled`]) and the tile of
/// `rows` rows starts at row `a`: the tile's elements `e` of its rows side
/// by side.
#[inline(always)]
pub(crate) fn tiled_at(per_row: usize, a: usize, rows: usize, j: usize, e: usize) -> usize {
    a * per_row + e * rows + j
}

/// The integer corrections of one block for weights stored with a bias
/// (the 512-bit kernels keep signed values as unsigned bytes, `q + 32`,
/// `q + 128` or `q + 127`, so that a sum starting here is `sum(q x)`):
/// `-32` times the sum of the block's quantized values 0..16 and 16..32,
/// and `-128` and `-127` times the sum of all 32; and the two half sums
/// themselves as 16-bit integers in one word (values 0..16 in the low
/// half; each at most `16 * 127` in magnitude), which Q2_K's 16-value
/// mins multiply (`vpmaddwd`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Bias {
    pub halves32: [i32; 2],
    pub all128: i32,
    pub all127: i32,
    pub halves: i32,
}

impl Bias {
    /// The sum of the block's quantized values.
    #[inline(always)]
    pub(crate) fn sum(&self) -> i32 {
        (self.halves as i16 as i32) + ((self.halves >> 16) as i16 as i32)
    }

    /// Two blocks' sums as [`Acts::pairs`] has them.
    #[inline(always)]
    fn pair(b0: &Bias, b1: &Bias) -> i32 {
        (b0.sum() as i16 as u16 as u32 | ((b1.sum() as i16 as u16 as u32) << 16)) as i32
    }

    #[inline(always)]
    fn new(h0: i32, h1: i32) -> Self {
        Bias {
            halves32: [-32 * h0, -32 * h1],
            all128: -128 * (h0 + h1),
            all127: -127 * (h0 + h1),
            halves: (h0 as i16 as u16 as u32 | ((h1 as i16 as u16 as u32) << 16)) as i32,
        }
    }
}

/// Values from which [`Acts::quantize`] splits the rows across the pool.
const PARALLEL_MIN_VALUES: usize = 1 << 15;

/// The per-block outputs of a quantization, one entry per block.
struct Blocks<'a> {
    qs: &'a mut [Q8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    bias: &'a mut [Bias],
    /// For one tile of rows regrouped ([`Acts::quantize_tiled`]): blocks
    /// per row and the tile's rows; else the blocks in row order.
    tile: Option<(usize, usize)>,
}

impl Blocks<'_> {
    /// Block `i`'s fields (the `i`-th block of the rows in order).
    #[inline(always)]
    fn at(&mut self, i: usize) -> (&mut Q8, &mut f32, &mut f32, &mut Bias) {
        let i = match self.tile {
            Some((nb, rows)) => tiled_at(nb, 0, rows, i / nb, i % nb),
            None => i,
        };
        (
            &mut self.qs[i],
            &mut self.d[i],
            &mut self.s[i],
            &mut self.bias[i],
        )
    }
}

/// Quantizes whole spans of `span` values `x` into `out` (32: a scale
/// per block; more: one per span).
#[inline(always)]
fn quantize_blocks(x: &[f32], span: usize, mut out: Blocks<'_>) {
    let mut amax = 0f32;
    for (i, block) in x.chunks_exact(QK).enumerate() {
        let (q, d, s, bias) = out.at(i);
        if (i * QK).is_multiple_of(span) {
            amax = x[i * QK..][..span].iter().fold(0f32, |a, v| a.max(v.abs()));
        }
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut half = [0i32; 2];
        for (j, (q, &v)) in q.0.iter_mut().zip(block).enumerate() {
            *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
            half[j / (QK / 2)] += *q as i32;
        }
        (*d, *s) = scales(amax, half[0] + half[1], span);
        *bias = Bias::new(half[0], half[1]);
    }
}

/// `d` and `s` of a block from its scale's largest magnitude and its quant
/// sum: with llama.cpp's f16 roundings for a span of 32; for longer spans
/// `d` in f32 (as its Q8_K) and `s` the quant sum itself (exact in f32),
/// which the Q4_K and Q5_K kernels multiply by the block's offsets before
/// the span's `d` applies to the whole span.
#[inline(always)]
fn scales(amax: f32, sum: i32, span: usize) -> (f32, f32) {
    let d = amax / 127.0;
    if span == QK {
        (
            f16::from_f32(d).to_f32(),
            f16::from_f32(d * sum as f32).to_f32(),
        )
    } else {
        (d, sum as f32)
    }
}

/// [`quantize_blocks`] with AVX2: the same operations in the same order
/// (so the same bits for finite inputs), eight values per instruction.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_blocks_avx2(x: &[f32], span: usize, mut out: Blocks<'_>) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    // `packs` interleaves its inputs per 128-bit lane; this restores order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut amax = 0f32;
    for (i, block) in x.chunks_exact(QK).enumerate() {
        let (q, d, s, bias) = out.at(i);
        let p = block.as_ptr();
        // SAFETY: `block` holds 32 values, and a span starting here `span`
        // (whole spans); `q` 32 bytes.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            if (i * QK).is_multiple_of(span) {
                let mut a = _mm256_setzero_ps();
                for e in (0..span).step_by(8) {
                    a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(e))));
                }
                let m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            }
            let id = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            let i = v.map(|v| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v, id),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            // Values 0..16 and 16..32: pairwise sums of both halves
            // side by side, then the 128-bit lanes added.
            let halves =
                _mm256_hadd_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let halves = _mm256_hadd_epi32(halves, halves);
            let halves = _mm_add_epi32(
                _mm256_castsi256_si128(halves),
                _mm256_extracti128_si256::<1>(halves),
            );
            let (h0, h1) = (_mm_cvtsi128_si32(halves), _mm_extract_epi32::<1>(halves));
            let b = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let b = _mm256_permutevar8x32_epi32(b, order);
            _mm256_storeu_si256(q.0.as_mut_ptr().cast(), b);
            (*d, *s) = scales(amax, h0 + h1, span);
            *bias = Bias::new(h0, h1);
        }
    }
}

/// Quantization of whole spans, with AVX2 where present.
fn quantize_into(x: &[f32], span: usize, out: Blocks<'_>) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx2.is_available() {
        // SAFETY: `Isa::Avx2` is AVX2 + FMA + F16C, the features the
        // function is compiled for.
        return unsafe { quantize_blocks_avx2(x, span, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.1") {
        /// With SSE4.1, whose `roundps` replaces a libm call per value.
        #[target_feature(enable = "sse4.1")]
        fn sse41(x: &[f32], span: usize, out: Blocks<'_>) {
            quantize_blocks(x, span, out)
        }
        // SAFETY: the CPU supports the feature the function is compiled for.
        return unsafe { sse41(x, span, out) };
    }
    quantize_blocks(x, span, out)
}

impl Acts {
    /// Activation rows.
    #[inline(always)]
    pub(crate) fn rows(&self) -> usize {
        self.qs.len() / self.nb
    }

    /// The rows of the tile [`Acts::quantize_tiled`] makes next with
    /// `left` rows left: 16 with [`Acts::tiles16`] while 16 are left, else
    /// [`crate::x8::tile_rows`] of at most 8.
    #[inline(always)]
    pub(crate) fn tile_rows(&self, left: usize) -> usize {
        if self.tiles16 && left >= 16 {
            16
        } else {
            crate::x8::tile_rows(left, 8)
        }
    }

    /// Room for `x` (rows of `k` values, `k` a multiple of `span`, 32 or
    /// 256) quantized, all zero.
    fn zeroed(x: &[f32], k: usize, span: usize, tiled: bool, tiles16: bool) -> Acts {
        assert!(
            matches!(span, QK | 256) && k.is_multiple_of(span),
            "rows of {k} values in spans of {span}"
        );
        let blocks = x.len() / QK;
        Acts {
            nb: k / QK,
            span,
            qs: vec![Q8([0; QK]); blocks],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            bias: vec![Bias::default(); blocks],
            start127: Vec::new(),
            pairs: Vec::new(),
            tiled,
            tiles16,
        }
    }

    /// `x`: rows of `k` values (`k` a multiple of `span`, 32 or 256), row
    /// major, with one scale per `span` values. Large inputs (prefill
    /// chunks) are split by rows across the pool.
    pub(crate) fn quantize(x: &[f32], k: usize, span: usize) -> Acts {
        use rayon::prelude::*;
        let mut a = Acts::zeroed(x, k, span, false, false);
        let (nb, blocks) = (a.nb, a.qs.len());
        let rows = blocks / nb.max(1);
        if x.len() >= PARALLEL_MIN_VALUES && rows > 1 && rayon::current_num_threads() > 1 {
            // Whole rows per task, at least a few thousand values each.
            let per = nb * (PARALLEL_MIN_VALUES / 8 / k).max(1);
            x.par_chunks(per * QK)
                .zip(a.qs.par_chunks_mut(per))
                .zip(a.d.par_chunks_mut(per))
                .zip(a.s.par_chunks_mut(per))
                .zip(a.bias.par_chunks_mut(per))
                .for_each(|((((x, qs), d), s), bias)| {
                    let tile = None;
                    quantize_into(
                        x,
                        span,
                        Blocks {
                            qs,
                            d,
                            s,
                            bias,
                            tile,
                        },
                    )
                });
        } else {
            let out = Blocks {
                qs: &mut a.qs,
                d: &mut a.d,
                s: &mut a.s,
                bias: &mut a.bias,
                tile: None,
            };
            quantize_into(x, span, out);
        }
        if span > QK {
            a.start127 = a
                .bias
                .chunks_exact(span / QK)
                .map(|b| b.iter().map(|b| b.all127).sum())
                .collect();
            a.pairs = a
                .bias
                .chunks_exact(2)
                .map(|b| Bias::pair(&b[0], &b[1]))
                .collect();
        }
        a
    }

    /// [`Acts::quantize`] with the rows regrouped by the tiles the 512-bit
    /// kernels take from row 0 on (`tile_rows(left, 8)` rows each): element
    /// `e` of row `a + j` at [`tiled_at`], so that a tile's rows read their
    /// block `b` from one place (`8 b` blocks on, for a tile of eight), one
    /// address for the kernel's eight rows instead of eight (prefill 2-6%
    /// faster, `benches/README.md`, `benches/HISTORY.md`). The same values as [`Acts::quantize`],
    /// each row quantized alone either way. With `tiles16`, tiles of 16
    /// rows first, as the AMX tiles take them ([`Acts::tile_rows`]).
    pub(crate) fn quantize_tiled(x: &[f32], k: usize, span: usize, tiles16: bool) -> Acts {
        use rayon::prelude::*;
        let mut a = Acts::zeroed(x, k, span, true, tiles16);
        let (nb, blocks) = (a.nb, a.qs.len());
        let rows = blocks / nb.max(1);
        // The tiles' first rows and sizes.
        let mut tiles = Vec::new();
        let mut r = 0;
        while r < rows {
            let at = a.tile_rows(rows - r);
            tiles.push((r, at));
            r += at;
        }
        // Each tile's part of every field, quantized by one task.
        let mut parts = Vec::with_capacity(tiles.len());
        let (mut qs, mut d, mut sums, mut bias) =
            (&mut a.qs[..], &mut a.d[..], &mut a.s[..], &mut a.bias[..]);
        for &(r, at) in &tiles {
            let n = at * nb;
            let (q0, q1) = qs.split_at_mut(n);
            let (d0, d1) = d.split_at_mut(n);
            let (s0, s1) = sums.split_at_mut(n);
            let (b0, b1) = bias.split_at_mut(n);
            parts.push((
                r,
                at,
                Blocks {
                    qs: q0,
                    d: d0,
                    s: s0,
                    bias: b0,
                    tile: Some((nb, at)),
                },
            ));
            (qs, d, sums, bias) = (q1, d1, s1, b1);
        }
        let quantize = |(r, at, out): (usize, usize, Blocks<'_>)| {
            quantize_into(&x[r * k..(r + at) * k], span, out)
        };
        if x.len() >= PARALLEL_MIN_VALUES && parts.len() > 1 && rayon::current_num_threads() > 1 {
            parts.into_par_iter().for_each(quantize);
        } else {
            parts.into_iter().for_each(quantize);
        }
        if span > QK {
            // Span `t` of row `a + j` at `tiled_at(spans per row, ..)`.
            let per = span / QK;
            let spans = nb / per;
            a.start127 = vec![0; blocks / per];
            for &(r, at) in &tiles {
                for j in 0..at {
                    for t in 0..spans {
                        a.start127[tiled_at(spans, r, at, j, t)] = (t * per..(t + 1) * per)
                            .map(|b| a.bias[tiled_at(nb, r, at, j, b)].all127)
                            .sum();
                    }
                }
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outputs for the blocks of `x`.
    #[derive(Debug, PartialEq)]
    struct Owned {
        qs: Vec<[i8; QK]>,
        d: Vec<f32>,
        s: Vec<f32>,
        bias: Vec<Bias>,
    }

    /// `x` quantized by `f`.
    fn quantized(x: &[f32], f: impl FnOnce(&[f32], Blocks<'_>)) -> Owned {
        let n = x.len() / QK;
        let mut qs = vec![Q8([0; QK]); n];
        let (mut d, mut s, mut bias) = (vec![0.0; n], vec![0.0; n], vec![Bias::default(); n]);
        let out = Blocks {
            qs: &mut qs,
            d: &mut d,
            s: &mut s,
            bias: &mut bias,
            tile: None,
        };
        f(x, out);
        Owned {
            qs: qs.iter().map(|q| q.0).collect(),
            d,
            s,
            bias,
        }
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
        let plain = quantized(&x, |x, out| quantize_blocks(x, QK, out));
        let last = plain.qs.last().unwrap();
        assert_eq!(
            (last[1], last[2], last[14]),
            (-14, -14, -2),
            "ties go to even"
        );
        for (q, bias) in plain.qs.iter().zip(&plain.bias) {
            let half = |r: std::ops::Range<usize>| q[r].iter().map(|&v| v as i32).sum::<i32>();
            let (h0, h1) = (half(0..16), half(16..32));
            assert_eq!(bias.halves32, [-32 * h0, -32 * h1]);
            assert_eq!(bias.all128, -128 * (h0 + h1));
            assert_eq!(bias.all127, -127 * (h0 + h1));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx2.is_available() {
            // SAFETY: the features were checked just above.
            let simd = quantized(&x, |x, out| unsafe { quantize_blocks_avx2(x, QK, out) });
            assert_eq!(plain, simd);
        }
    }

    #[test]
    fn spans_of_256_share_one_scale() {
        // Six spans of eight blocks: varied magnitudes per span and per
        // block, and an all-zero span.
        let mut x: Vec<f32> = (0..256 * 5)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2654435761) >> 8;
                let v = h as f32 / (1 << 24) as f32 - 0.5;
                v * (1 + (i / 32) % 5) as f32 * 10f32.powi(i / 256 - 2)
            })
            .collect();
        x.extend([0.0; 256]);
        let plain = quantized(&x, |x, out| quantize_blocks(x, 256, out));
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx2.is_available() {
            // SAFETY: the features were checked just above.
            let simd = quantized(&x, |x, out| unsafe { quantize_blocks_avx2(x, 256, out) });
            assert_eq!(plain, simd);
        }
        for (t, span) in x.chunks_exact(256).enumerate() {
            let amax = span.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = &plain.d[8 * t..8 * t + 8];
            assert!(d.iter().all(|&d| d == amax / 127.0), "span {t}: {d:?}");
            let qs = &plain.qs[8 * t..8 * t + 8];
            let top = qs.iter().flatten().map(|q| q.unsigned_abs()).max();
            assert_eq!(top, Some(if amax > 0.0 { 127 } else { 0 }), "span {t}");
            for (j, (&v, &q)) in span.iter().zip(qs.iter().flatten()).enumerate() {
                let err = (v - q as f32 * d[0]).abs();
                assert!(err <= 0.5001 * d[0], "span {t} value {j}: {v} as {q}");
            }
        }
        let x: Vec<f32> = x.iter().map(|v| v * 3.0).collect();
        let a = Acts::quantize(&x, 512, 256);
        assert_eq!(a.start127.len(), 6);
        for (t, start) in a.start127.iter().enumerate() {
            let sum: i32 = a.qs[8 * t..8 * t + 8]
                .iter()
                .flat_map(|q| q.0)
                .map(|q| q as i32)
                .sum();
            assert_eq!(*start, -127 * sum);
        }
    }

    #[test]
    fn tiled_rows_are_the_rows_regrouped() {
        // 21 rows: tiles of 8, 8, 4 and 1, or of 16, 4 and 1.
        let (m, k) = (21, 512);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        for (span, tiles16) in [(QK, false), (256, false), (QK, true), (256, true)] {
            let rows = Acts::quantize(&x, k, span);
            let tiled = Acts::quantize_tiled(&x, k, span, tiles16);
            assert!(tiled.tiled && !rows.tiled);
            let nb = k / QK;
            let mut a = 0;
            let sizes: &[usize] = if tiles16 { &[16, 4, 1] } else { &[8, 8, 4, 1] };
            for &at in sizes {
                for j in 0..at {
                    for b in 0..nb {
                        let (t, r) = (tiled_at(nb, a, at, j, b), (a + j) * nb + b);
                        assert_eq!(tiled.qs[t].0, rows.qs[r].0);
                        assert_eq!(tiled.d[t].to_bits(), rows.d[r].to_bits());
                        assert_eq!(tiled.s[t].to_bits(), rows.s[r].to_bits());
                        assert_eq!(tiled.bias[t], rows.bias[r]);
                    }
                    let spans = k / span;
                    if span > QK {
                        for t in 0..spans {
                            assert_eq!(
                                tiled.start127[tiled_at(spans, a, at, j, t)],
                                rows.start127[(a + j) * spans + t]
                            );
                        }
                    }
                }
                a += at;
            }
            assert_eq!(a, m);
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
            .install(|| Acts::quantize(&x, k, QK));
        let serial = quantized(&x, |x, out| quantize_blocks(x, QK, out));
        assert_eq!(a.nb, k / QK);
        let parallel = Owned {
            qs: a.qs.iter().map(|q| q.0).collect(),
            d: a.d,
            s: a.s,
            bias: a.bias,
        };
        assert_eq!(parallel, serial);
    }
}
