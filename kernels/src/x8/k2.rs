//! Q2_K with eight weight rows interleaved (see the parent module).
//!
//! Q2_K keeps `w = d sc q - dmin mn` per 16 values: `q` in 0..4 (two
//! bits), a 4-bit scale `sc` and min `mn` per 16 values, and f16 `d`,
//! `dmin` per 256. [`K2x8`] keeps, per group block, the values' two bits
//! as Q3_K's low bits ([`Crumbs8`], 64 bytes) and each row's `sc | mn << 4`
//! per half block as the GGUF has them (16 bytes), and per super-block
//! eight f16 `d` and `dmin`: 84 bytes per 256 values and row, the GGUF
//! block's size.
//!
//! The activations come with one scale per 256 values (as `d` and `dmin`
//! are per super-block; [`crate::Format::activation_span`]), so a whole
//! super-block's two terms are exact integer sums under one float factor
//! each: `sum w x = d_x (d S1 - dmin S2)`, with `S1 = sum_h sc_h sum_{j in
//! h} q_j x_j` and `S2 = sum_h mn_h X_h` over its sixteen 16-value halves
//! `h`, where `x_j` are the quantized activations (factor `d_x`) and `X_h`
//! the sum of half `h` of them ([`crate::act::Bias::halves`]). So the mins
//! meet the activations' exact sums, not the f16 block sum that the
//! 32-value offsets use, and the float work is once per 256 values.
//!
//! - The 256-bit tiles sum each half's `q x` (the values are unsigned:
//!   `vpdpbusd`, or `vpmaddubsw` without VNNI), pack the two half sums (at
//!   most `16 * 3 * 127` in magnitude) into 16-bit pairs and multiply them
//!   by the pairs of scales (`vpmaddwd`); `S2` is one `vpmaddwd` of the
//!   pairs of mins and of activation half sums; both add up over the
//!   super-block, then `(d S1 - dmin S2) d_x` in three float operations.
//! - The 512-bit kernels multiply the values by their scales as they unpack
//!   them (`p = sc q` in 0..=45, unsigned bytes: one `vpmullw` per register,
//!   as the two bytes of a 16-bit lane never carry into each other), sum
//!   `p x` in one chain over the super-block, and `S2` by `vpdpwssd`
//!   ([`Sums::Mins16`]).
//!
//! Both give the same integers, and the float operations are the same in
//! the same order, so the same bits.

use super::i8::Crumbs8;
#[cfg(target_arch = "x86_64")]
use super::wide::{join_ps, load_pair, Sums, Unpacked};
use super::{group_blocks, interleave, prefetch_blocks, Group8, Half8, G, SPAN_BLOCKS};
use crate::act::Acts;
use crate::formats::{Q8, QK};

/// The scales and mins of one group block: byte `2 l + h` is row `l`'s
/// `sc | mn << 4` for values `16 h..16 h + 16`.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ScMin8(pub [u8; 16]);

/// A Q2_K matrix with its rows interleaved by eight; block `b` of group `g`
/// at `g * nb + b`, its super-block's `d` and `dmin` at `(g * nb + b) / 8`.
#[derive(Debug)]
pub(crate) struct K2x8 {
    /// Real rows (the last group may be partly padding).
    pub n: usize,
    pub nb: usize,
    pub qs: Vec<Crumbs8>,
    pub sm: Vec<ScMin8>,
    pub d: Vec<Half8>,
    pub dmin: Vec<Half8>,
}

impl K2x8 {
    /// Interleaves `n` rows of `nb` blocks: `qs[r * nb + b]` the values (in
    /// 0..4) of block `b` of row `r`, `sm` its two `sc | mn << 4`; `d` and
    /// `dmin` already interleaved per super-block.
    ///
    /// # Panics
    /// If a value is out of range or the sizes disagree.
    pub(crate) fn new(
        qs: &[Q8],
        sm: &[[u8; 2]],
        n: usize,
        nb: usize,
        d: Vec<Half8>,
        dmin: Vec<Half8>,
    ) -> Self {
        let qs: Vec<Crumbs8> = group_blocks(n, nb)
            .map(|rows| {
                let q: [i8; 256] = interleave(rows.map(|i| i.map(|i| &qs[i].0)));
                assert!(
                    q.iter().all(|q| (0..4).contains(q)),
                    "2-bit value out of range"
                );
                Crumbs8::pack(&q.map(|q| q as u8))
            })
            .collect();
        let sm: Vec<ScMin8> = group_blocks(n, nb)
            .map(|rows| {
                let mut out = ScMin8::default();
                for (l, i) in rows.iter().enumerate() {
                    if let Some(i) = i {
                        out.0[2 * l..2 * l + 2].copy_from_slice(&sm[*i]);
                    }
                }
                out
            })
            .collect();
        assert!(d.len() == dmin.len() && d.len() * G == qs.len() && sm.len() == qs.len());
        Self {
            n,
            nb,
            qs,
            sm,
            d,
            dmin,
        }
    }

    /// Row `l`'s scale and min of half `h` of block `i`.
    fn sc_mn(&self, i: usize, l: usize, h: usize) -> (i32, i32) {
        let b = self.sm[i].0[2 * l + h];
        ((b & 0xF) as i32, (b >> 4) as i32)
    }

    /// The eight rows' scales and mins of block `i`, each as 16-bit pairs
    /// (values 0..16's in the low half of each row's 32-bit lane).
    ///
    /// # Safety
    /// AVX2; block `i` exists.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn sc_mn256(&self, i: usize) -> [std::arch::x86_64::__m256i; 2] {
        use std::arch::x86_64::*;
        let b = _mm256_cvtepu8_epi16(_mm_load_si128(self.sm.as_ptr().add(i).cast()));
        [
            _mm256_and_si256(b, _mm256_set1_epi16(0xF)),
            _mm256_srli_epi16::<4>(b),
        ]
    }

    /// Blocks `i0` and `i1`'s scale and min pairs (as [`K2x8::sc_mn256`])
    /// in the halves of 512-bit registers.
    ///
    /// # Safety
    /// AVX-512 F/BW; both blocks exist.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn sc_mn512(&self, i0: usize, i1: usize) -> [std::arch::x86_64::__m512i; 2] {
        use std::arch::x86_64::*;
        let b = _mm512_cvtepu8_epi16(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_load_si128(self.sm.as_ptr().add(i0).cast())),
            _mm_load_si128(self.sm.as_ptr().add(i1).cast()),
        ));
        [
            _mm512_and_si512(b, _mm512_set1_epi16(0xF)),
            _mm512_srli_epi16::<4>(b),
        ]
    }
}

impl Group8 for K2x8 {
    const HALVES: bool = true;
    const SPAN256: bool = true;
    const AHEAD: usize = prefetch_blocks::<Crumbs8>();

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch<const HINT: i32>(&self, i: usize) {
        super::hint::<HINT, _>(&self.qs, i, 1);
        super::hint::<HINT, _>(&self.sm, i, 1);
    }

    fn rows(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        self.nb
    }

    fn q(&self, i: usize, l: usize, j: usize) -> i32 {
        self.qs[i].get(l, j) as i32
    }

    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32) {
        let (sc, mn) = self.sc_mn(i, l, j / 16);
        (
            self.d[i / G].get(l) * sc as f32,
            -(self.dmin[i / G].get(l) * mn as f32),
        )
    }

    /// The integer sums of the module docs: the mins times the activations'
    /// half sums.
    fn dot(&self, acts: &Acts, g: usize, l: usize, a: usize) -> f32 {
        let nb = self.nb;
        let mut acc = 0f32;
        // The span's sums so far (the activations have one scale per 256
        // values, as `d` and `dmin` are per super-block).
        let (mut s1, mut s2) = (0i32, 0i32);
        for b in 0..nb {
            let (i, ai) = (g * nb + b, a * nb + b);
            let x = &acts.qs[ai].0;
            let halves = acts.bias[ai].halves;
            for h in 0..2 {
                let (sc, mn) = self.sc_mn(i, l, h);
                let js = QK / 2 * h..QK / 2 * (h + 1);
                s1 += sc * js.map(|j| self.q(i, l, j) * x[j] as i32).sum::<i32>();
                s2 += mn * (halves >> (16 * h)) as i16 as i32;
            }
            if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                let dx = acts.d[ai];
                let (d, dmin) = (self.d[i / G].get(l), self.dmin[i / G].get(l));
                acc += (d * s1 as f32 + -dmin * s2 as f32) * dx;
                (s1, s2) = (0, 0);
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tile<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A] {
        use std::arch::x86_64::*;
        let nb = self.nb;
        assert!((g + 1) * nb <= self.qs.len() && (a + A) * nb <= acts.qs.len());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        // Each row's `S1` and `S2` of the span so far.
        let mut spans = [[_mm256_setzero_si256(); 2]; A];
        for b in 0..nb {
            let i = g * nb + b;
            if PREFETCH {
                self.prefetch_ahead(i);
            }
            let p = self.qs.as_ptr().add(i) as *const __m256i;
            let w = Crumbs8::regs256(_mm256_load_si256(p), _mm256_load_si256(p.add(1)));
            let [sc, mn] = self.sc_mn256(i);
            let d = self.d.get_unchecked(i / G).load();
            let nd = _mm256_sub_ps(_mm256_setzero_ps(), self.dmin.get_unchecked(i / G).load());
            for (j, (acc, span)) in acc.iter_mut().zip(&mut spans).enumerate() {
                let ai = (a + j) * nb + b;
                let x = acts.qs.as_ptr().add(ai) as *const i32;
                // Each half's sum of `q x`: four products of at most 2 * 3
                // * 127 add up in i16 without VNNI.
                let mut s = [_mm256_setzero_si256(); 2];
                for (h, (s, w)) in s.iter_mut().zip(w.chunks_exact(4)).enumerate() {
                    let x = x.add(4 * h);
                    if VNNI != super::NO_VNNI {
                        for (v, &w) in w.iter().enumerate() {
                            let xv = _mm256_set1_epi32(x.add(v).read());
                            *s = super::simd::dpbusd::<VNNI>(*s, w, xv);
                        }
                    } else {
                        let mut s16 = _mm256_setzero_si256();
                        for (v, &w) in w.iter().enumerate() {
                            let xv = _mm256_set1_epi32(x.add(v).read());
                            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, xv));
                        }
                        *s = _mm256_madd_epi16(s16, ones);
                    }
                }
                // The half sums as 16-bit pairs, times the scale pairs.
                let pairs = _mm256_blend_epi16::<0b1010_1010>(s[0], _mm256_slli_epi32::<16>(s[1]));
                span[0] = _mm256_add_epi32(span[0], _mm256_madd_epi16(pairs, sc));
                let halves = _mm256_set1_epi32((*acts.bias.as_ptr().add(ai)).halves);
                span[1] = _mm256_add_epi32(span[1], _mm256_madd_epi16(mn, halves));
                if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                    // `(d S1 - dmin S2) d_x`, once per span.
                    let t = _mm256_fmadd_ps(
                        nd,
                        _mm256_cvtepi32_ps(span[1]),
                        _mm256_mul_ps(d, _mm256_cvtepi32_ps(span[0])),
                    );
                    let dx = _mm256_set1_ps(*acts.d.get_unchecked(ai));
                    *acc = _mm256_fmadd_ps(t, dx, *acc);
                    *span = [_mm256_setzero_si256(); 2];
                }
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    const SUMS: Sums = Sums::Mins16;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_pair(&self, i0: usize, i1: usize) -> Unpacked {
        use std::arch::x86_64::*;
        let low16 = _mm512_set1_epi32(0xFFFF);
        let (p0, p1) = (
            self.qs.as_ptr().add(i0) as *const __m256i,
            self.qs.as_ptr().add(i1) as *const __m256i,
        );
        let mut w = Crumbs8::regs512(load_pair(p0, p1), load_pair(p0.add(1), p1.add(1)));
        // Each row's scale of half `h` in both 16-bit halves of its lane,
        // then `p = sc q` for the registers of that half.
        let [sc, _] = self.sc_mn512(i0, i1);
        let scale = [
            _mm512_or_si512(_mm512_and_si512(sc, low16), _mm512_slli_epi32::<16>(sc)),
            _mm512_or_si512(_mm512_srli_epi32::<16>(sc), _mm512_andnot_si512(low16, sc)),
        ];
        for (v, w) in w.iter_mut().enumerate() {
            *w = _mm512_mullo_epi16(*w, scale[v / 4]);
        }
        let (d0, d1) = (self.d.get_unchecked(i0 / G), self.d.get_unchecked(i1 / G));
        let (m0, m1) = (
            self.dmin.get_unchecked(i0 / G),
            self.dmin.get_unchecked(i1 / G),
        );
        let zero = _mm512_setzero_ps();
        Unpacked {
            w,
            d: join_ps(d0.load(), d1.load()),
            m: _mm512_sub_ps(zero, join_ps(m0.load(), m1.load())),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn mins2(&self, i0: usize, i1: usize) -> std::arch::x86_64::__m512i {
        self.sc_mn512(i0, i1)[1]
    }
}
