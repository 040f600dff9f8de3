//! The AVX2 + FMA kernel of [`super::F32Matrix`]: tiles of [`MR`] rows x
//! [`NR`] columns, and the exact GELU on 8 lanes for its epilogue.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Dest, Init, KC, MR, NR};
use crate::math::{erf_consts, exp_consts};

/// The input side of a tile kernel: the activations and weights of one
/// task, multiplied into a tile's sums.
pub(crate) trait TileKernel: Copy {
    /// `R` rows (from row `r`, a multiple of [`MR`]) x the panel's 16
    /// columns over inputs `q` (a pass; it starts at a multiple of 8),
    /// continuing each sum from where `sink` says and storing it there.
    ///
    /// # Safety
    /// As [`block`]'s.
    unsafe fn tile<const R: usize, const FULL: bool>(self, r: usize, q: Range<usize>, sink: Sink);
}

/// Defines a `block` function compiled for the instruction set
/// `features`, which runs [`block_body`] (one per tile kernel's set).
macro_rules! block_for {
    ($(#[$doc:meta])* $name:ident, $features:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name<K: TileKernel>(
            kern: K,
            k: usize,
            out: Dest,
            init: Init,
            gelu: bool,
            rows: Range<usize>,
            cols: Range<usize>,
        ) {
            block_body(kern, k, out, init, gelu, rows, cols)
        }
    };
}

block_for!(
    /// `out[rows, cols] (+)= x[rows] . panel` in tiles of [`MR`] rows,
    /// [`KC`] inputs at a time over all the tiles, so that slice of the
    /// panel stays in L1; sums start as `init` says, and with `gelu` the
    /// last pass stores `gelu(sum)`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `kern`'s activations cover the tiles of
    /// `rows` and its panel `k` inputs; `out` (and `init`'s pointers)
    /// cover `rows x cols` at their layouts, and no other thread touches
    /// those elements meanwhile.
    block,
    "avx2,fma"
);

block_for!(
    /// [`block`] for tile kernels that use AVX-VNNI (`vpdpwssd`).
    ///
    /// # Safety
    /// As [`block`], and the CPU has AVX-VNNI.
    block_avxvnni,
    "avx2,fma,avxvnni"
);

block_for!(
    /// [`block`] for tile kernels that use AVX-512 VNNI (`vpdpwssd` on
    /// 512-bit registers).
    ///
    /// # Safety
    /// As [`block`], and the CPU has AVX-512 F, BW, VL and VNNI.
    block_avx512vnni,
    "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// [`block`]'s body, compiled into each of its callers' instruction sets.
#[inline(always)]
unsafe fn block_body<K: TileKernel>(
    kern: K,
    k: usize,
    out: Dest,
    init: Init,
    gelu: bool,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    assert!(rows.start.is_multiple_of(MR));
    assert!(cols.len() <= NR && cols.start.is_multiple_of(NR));
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut masks = [lane; 2];
    for (t, mask) in masks.iter_mut().enumerate() {
        let lanes = cols.len().saturating_sub(8 * t).min(8) as i32;
        *mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), lane);
    }
    let full = cols.len() == NR;
    let (rs, hs) = out.strides();
    let mut q0 = 0;
    while q0 < k {
        let q = q0..k.min(q0 + KC);
        let last = q.end == k;
        let mut r = rows.start;
        while r < rows.end {
            let d = out.ptr.0.add(out.base(r, cols.start));
            // The next tile's outputs, asked for while this one runs (on
            // the first pass they come from L3 or memory); the line of a
            // row's last column may lie past a partial panel's end, hence
            // `wrapping_add` (a prefetch of any address is harmless).
            if r + MR < rows.end {
                let next = out.ptr.0.wrapping_add(out.base(r + MR, cols.start));
                for i in 0..MR.min(rows.end - r - MR) {
                    let at = next.wrapping_add(i * rs);
                    _mm_prefetch::<_MM_HINT_T0>(at.cast());
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(hs + 7).cast());
                }
            }
            let sink = Sink {
                d,
                rs,
                hs,
                masks,
                start: if q0 == 0 {
                    init.rows_down(r - rows.start)
                } else {
                    None
                },
                gelu: gelu && last,
            };
            let q = q.clone();
            match (rows.end - r, full) {
                (1, _) => kern.tile::<1, false>(r, q, sink),
                (2, _) => kern.tile::<2, false>(r, q, sink),
                (3, _) => kern.tile::<3, false>(r, q, sink),
                (4, _) => kern.tile::<4, false>(r, q, sink),
                (5, _) => kern.tile::<5, false>(r, q, sink),
                (_, true) => kern.tile::<MR, true>(r, q, sink),
                (_, false) => kern.tile::<MR, false>(r, q, sink),
            }
            r += MR;
        }
        q0 += KC;
    }
}

/// Where one tile's sums start and go: `d` at its first output with rows
/// `rs` and halves `hs` apart; the lanes of a partial panel (`masks`);
/// where its sums start on this pass (`None`: from `d`); whether to store
/// `gelu` of them.
#[derive(Clone, Copy)]
pub(crate) struct Sink {
    d: *mut f32,
    rs: usize,
    hs: usize,
    masks: [__m256i; 2],
    start: Option<Init>,
    gelu: bool,
}

impl Sink {
    /// Where the sums of row `i`, half `h` start: the destination's
    /// values, or bias plus residual.
    #[inline(always)]
    pub(crate) unsafe fn first<const FULL: bool>(self, i: usize, h: usize) -> __m256 {
        match self.start {
            None => load::<FULL>(self.d.add(i * self.rs + self.hs * h), self.masks[h]),
            Some(init) => {
                let b = load::<FULL>(init.bias.add(8 * h), self.masks[h]);
                if init.residual.is_null() {
                    b
                } else {
                    let at = init.residual.add(i * init.ldr + 8 * h);
                    _mm256_add_ps(load::<FULL>(at, self.masks[h]), b)
                }
            }
        }
    }

    /// Stores the sums of row `i`, half `h` (through GELU on the last
    /// pass when asked).
    #[inline(always)]
    pub(crate) unsafe fn store<const FULL: bool>(self, i: usize, h: usize, v: __m256) {
        let v = if self.gelu { gelu_erf(v) } else { v };
        self.put::<FULL>(i, h, v);
    }

    /// [`Sink::first`] of both halves of row `i` in one 512-bit register
    /// (for kernels run with AVX-512F).
    #[inline(always)]
    pub(crate) unsafe fn first_wide<const FULL: bool>(self, i: usize) -> __m512 {
        let lo = _mm512_castps_pd(_mm512_castps256_ps512(self.first::<FULL>(i, 0)));
        let hi = _mm256_castps_pd(self.first::<FULL>(i, 1));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, hi))
    }

    /// [`Sink::store`] of both halves of row `i` from one 512-bit register,
    /// GELU on its 16 lanes (the same bits; for kernels run with
    /// AVX-512F).
    #[inline(always)]
    pub(crate) unsafe fn store_wide<const FULL: bool>(self, i: usize, v: __m512) {
        let v = if self.gelu {
            super::avx512::gelu_erf(v)
        } else {
            v
        };
        let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
        self.put::<FULL>(i, 0, _mm512_castps512_ps256(v));
        self.put::<FULL>(i, 1, _mm256_castpd_ps(hi));
    }

    /// Stores `v` as the sums of row `i`, half `h`.
    #[inline(always)]
    unsafe fn put<const FULL: bool>(self, i: usize, h: usize, v: __m256) {
        let at = self.d.add(i * self.rs + self.hs * h);
        if FULL {
            _mm256_storeu_ps(at, v);
        } else {
            _mm256_maskstore_ps(at, self.masks[h], v);
        }
    }
}

/// The f32 kernel's inputs: `a` at the packed tiles (`tile_len` apart),
/// `panel` at the panel's start (64-byte aligned lines of 16 columns).
#[derive(Clone, Copy)]
pub(super) struct F32Tiles {
    pub a: *const f32,
    pub tile_len: usize,
    pub panel: *const f32,
}

/// Input `q` of a tile (see [`F32Tiles::tile`]): two weight registers,
/// `R` broadcasts, `2 R` FMAs. Not a closure: closures do not take the
/// caller's target features, and the intrinsics would become calls.
#[inline(always)]
unsafe fn step<const R: usize>(acc: &mut [[__m256; 2]; R], t: *const f32, p: *const f32, q: usize) {
    let b = p.add(q * NR);
    let w = [_mm256_load_ps(b), _mm256_load_ps(b.add(8))];
    let x = t.add((q / 8) * MR * 8 + q % 8);
    for (i, acc) in acc.iter_mut().enumerate() {
        let xv = _mm256_broadcast_ss(&*x.add(8 * i));
        acc[0] = _mm256_fmadd_ps(xv, w[0], acc[0]);
        acc[1] = _mm256_fmadd_ps(xv, w[1], acc[1]);
    }
}

/// 8 values at `at`: all of them when `FULL`, else the lanes of `mask`.
#[inline(always)]
unsafe fn load<const FULL: bool>(at: *const f32, mask: __m256i) -> __m256 {
    if FULL {
        _mm256_loadu_ps(at)
    } else {
        _mm256_maskload_ps(at, mask)
    }
}

impl TileKernel for F32Tiles {
    /// Each sum continues from its start (the destination's value, or
    /// bias plus residual on the first pass), so splitting the inputs
    /// changes no bits.
    #[inline(always)]
    unsafe fn tile<const R: usize, const FULL: bool>(self, r: usize, q: Range<usize>, sink: Sink) {
        // Masked moves only for a last, partial panel (they are slow on
        // some CPUs, and every full tile would pay for them).
        // Loops, not `array::from_fn`: its closure would not take the
        // target features (see `step`).
        let t = self.a.add(r / MR * self.tile_len);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for (i, acc) in acc.iter_mut().enumerate() {
            for (h, acc) in acc.iter_mut().enumerate() {
                *acc = sink.first::<FULL>(i, h);
            }
        }
        let full = q.start + (q.end - q.start) / 8 * 8;
        for q8 in (q.start..full).step_by(8) {
            for u in 0..8 {
                step(&mut acc, t, self.panel, q8 + u);
            }
        }
        for q in full..q.end {
            step(&mut acc, t, self.panel, q);
        }
        for (i, acc) in acc.iter().enumerate() {
            for (h, &v) in acc.iter().enumerate() {
                sink.store::<FULL>(i, h, v);
            }
        }
    }
}

/// [`crate::math::exp_with`]`::<true>` on 8 lanes: the same operations in
/// the same order, so the same bits.
#[inline(always)]
unsafe fn exp(x: __m256) -> __m256 {
    use exp_consts::*;
    let set = _mm256_set1_ps;
    let x = _mm256_min_ps(_mm256_max_ps(x, set(-87.0)), set(88.0));
    let n = _mm256_floor_ps(_mm256_fmadd_ps(x, set(LOG2E), set(0.5)));
    let neg_n = _mm256_xor_ps(n, set(-0.0));
    let r = _mm256_fmadd_ps(neg_n, set(C2), _mm256_fmadd_ps(neg_n, set(C1), x));
    let mut p = set(P0);
    for c in P {
        p = _mm256_fmadd_ps(p, r, set(c));
    }
    let e_r = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), set(1.0));
    let two_n = _mm256_slli_epi32::<23>(_mm256_castps_si256(_mm256_add_ps(n, set(127.0 + MAGIC))));
    _mm256_mul_ps(e_r, _mm256_castsi256_ps(two_n))
}

/// [`crate::math::gelu_erf`]`::<true>` on 8 lanes (the same operations,
/// so the same bits).
#[inline(always)]
pub(crate) unsafe fn gelu_erf(x: __m256) -> __m256 {
    use erf_consts::*;
    let set = _mm256_set1_ps;
    let sign = set(-0.0);
    let z = _mm256_mul_ps(x, set(std::f32::consts::FRAC_1_SQRT_2));
    let a = _mm256_andnot_ps(sign, z);
    let t = _mm256_div_ps(set(1.0), _mm256_fmadd_ps(set(P), a, set(1.0)));
    let mut poly = set(A5);
    for c in A {
        poly = _mm256_fmadd_ps(poly, t, set(c));
    }
    let e = exp(_mm256_mul_ps(_mm256_xor_ps(a, sign), a));
    let y = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(poly, t), sign), e, set(1.0));
    let erf = _mm256_or_ps(_mm256_andnot_ps(sign, y), _mm256_and_ps(sign, z));
    _mm256_mul_ps(_mm256_mul_ps(set(0.5), x), _mm256_add_ps(set(1.0), erf))
}
