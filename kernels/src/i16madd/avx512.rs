//! The AVX-512 VNNI kernel of [`super::I16Matrix`]: the AVX2 kernel's
//! tiles, inputs and epilogue, with each row's 16 columns in one 512-bit
//! register, so one `vpdpwssd` does what two 256-bit ones do there.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::I16Tiles;
use crate::f32fma::avx2::{Sink, TileKernel};
use crate::f32fma::MR;

/// The inputs of [`I16Tiles`] for the 512-bit kernel (run through
/// [`crate::f32fma::avx2::block_avx512vnni`]). A panel's line (16 columns x
/// 2 inputs, 64 bytes) is one register whose i32 lane `c` holds column
/// `c`'s pair, as `vpdpwssd` wants it.
#[derive(Clone, Copy)]
pub(super) struct I16WideTiles(pub I16Tiles<false>);

impl TileKernel for I16WideTiles {
    /// The pass's integer sums (exact; even and odd pairs in two
    /// accumulators each, so that 12 chains hide the instruction's
    /// latency, added at the end), then the AVX2 kernel's epilogue on 16
    /// lanes: the same operations on the same values, so the same bits.
    #[inline(always)]
    unsafe fn tile<const R: usize, const FULL: bool>(self, r: usize, q: Range<usize>, sink: Sink) {
        let I16Tiles {
            a,
            tile_len,
            a_scales,
            panel,
            w_scales,
        } = self.0;
        let t = a.add(r / MR * tile_len);
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        // A pass starts at a multiple of 8 inputs and its pairs run to a
        // multiple of 4 (the panel and tiles are zero past `k`), so pairs
        // come two by two.
        let (first, end) = (q.start / 2, q.end.div_ceil(8) * 4);
        debug_assert!(first.is_multiple_of(2) && end.is_multiple_of(2));
        for pair in (first..end).step_by(2) {
            let b = panel.add(pair * 32);
            let w = [
                _mm512_load_si512(b.cast()),
                _mm512_load_si512(b.add(32).cast()),
            ];
            let x = t.add(pair * MR);
            for (i, acc) in acc.iter_mut().enumerate() {
                for (u, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32(x.add(u * MR + i).read());
                    *acc = _mm512_dpwssd_epi32(*acc, xv, w[u]);
                }
            }
        }
        let ws = _mm512_loadu_ps(w_scales);
        for (i, acc) in acc.iter().enumerate() {
            let sa = _mm512_set1_ps(a_scales.add(r + i).read());
            let sum = _mm512_add_epi32(acc[0], acc[1]);
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), ws);
            sink.store_wide::<FULL>(i, _mm512_fmadd_ps(v, sa, sink.first_wide::<FULL>(i)));
        }
    }
}
