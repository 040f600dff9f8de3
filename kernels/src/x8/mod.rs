//! Weight layouts with eight rows interleaved, and their kernels.
//!
//! The 32-value formats are stored by *groups* of eight consecutive weight
//! rows: for each 32-value block the eight rows' values sit together, so
//! that one 256-bit register holds four consecutive values of each of the
//! eight rows (one row per 32-bit lane). One activation block then feeds
//! eight rows at once: its four bytes `4 i..4 i + 4` are broadcast into
//! every lane and multiplied with register `i` (`vpmaddubsw`, or `vpdpbusd`
//! with AVX-512 VNNI), and after eight such steps each lane holds its row's
//! integer dot product over the block. The float work, `d_w d_x isum (+ m_w
//! s_x)`, is then a handful of instructions for all eight rows (the scales
//! of a group's block are eight f16, as in the GGUF blocks, widened with one
//! `vcvtph2ps`; the K-quants' integer sub-block scales are widened too), and the eight lanes are eight consecutive output columns:
//! no horizontal sums.
//!
//! - [`u4`]: Q4_0, Q4_1, Q4_K (4-bit values, `w = f q + m`) and Q5_0,
//!   Q5_1, Q5_K (5-bit);
//! - [`i8`]: Q8_0 (signed 8-bit values, `w = f q`), Q6_K (signed 6-bit,
//!   one factor per 16 values) and Q3_K (signed 3-bit, its integer
//!   16-value scales applied to the values, one factor per block);
//! - [`k2`]: Q2_K (2-bit values with a scale and a min per 16 values);
//! - [`scales`]: the factors `f` and offsets `m` as each format keeps them
//!   (the K-quants' 256-value super-blocks are eight 32-value blocks here,
//!   whose factors come from the integer sub-block scales).
//!
//! Rows are padded to a multiple of eight with zero weights; padded rows are
//! never written out. Work is cut into tiles of one group x 1, 2 or 4
//! activation rows (8 for Q4_K and Q5_K prompt steps on AVX-VNNI,
//! [`Group8::tall_tiles`]); a chunk of groups runs every activation tile
//! with the activation tiles outside, so the chunk's weights stay in L1.
//! With AVX-512 VNNI and more than four activation rows, [`wide`] runs two
//! groups to each 512-bit register and tiles of up to 8 activation rows;
//! with up to four (decode, bound by memory) the 256-bit tiles run.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod i8;
pub(crate) mod k2;
pub(crate) mod scales;
pub(crate) mod u4;
#[cfg(target_arch = "x86_64")]
pub(crate) mod wide;

use std::ops::Range;

use half::f16;

use crate::act::Acts;
use crate::formats::QK;
use crate::{Error, Out};

/// Rows per group.
pub(crate) const G: usize = 8;

/// Blocks per 256-value span (a K-quant super-block).
pub(crate) const SPAN_BLOCKS: usize = 256 / QK;

/// The source block index of each row of group `g`'s block `b` in a
/// one-row-at-a-time layout of `n` rows of `nb` blocks; `None` for the
/// padding rows past `n`.
pub(crate) fn group_rows(n: usize, nb: usize, g: usize, b: usize) -> [Option<usize>; G] {
    std::array::from_fn(|l| {
        let r = G * g + l;
        (r < n).then(|| r * nb + b)
    })
}

/// [`group_rows`] of every group block of `n` rows of `nb` blocks, in
/// storage order (block `b` of group `g` at `g * nb + b`).
/// Its exact length lets `collect` make each matrix's arrays in one
/// allocation, which the allocator then puts on huge pages whole (a vector
/// grown by doubling keeps the small pages it was first written to).
pub(crate) fn group_blocks(
    n: usize,
    nb: usize,
) -> impl ExactSizeIterator<Item = [Option<usize>; G]> {
    (0..n.div_ceil(G) * nb).map(move |i| group_rows(n, nb, i / nb, i % nb))
}

/// Eight rows' blocks of `N` values interleaved by runs of four: value
/// `32 k + 4 l + t` of the result is value `4 k + t` of row `l` (zero for a
/// missing row). `OUT` is `8 N`.
pub(crate) fn interleave<T: Copy + Default, const N: usize, const OUT: usize>(
    rows: [Option<&[T; N]>; G],
) -> [T; OUT] {
    assert_eq!(OUT, G * N, "an interleaved block holds eight rows");
    let mut out = [T::default(); OUT];
    for (l, row) in rows.iter().enumerate() {
        let Some(row) = row else { continue };
        for k in 0..N / 4 {
            out[32 * k + 4 * l..32 * k + 4 * l + 4].copy_from_slice(&row[4 * k..4 * k + 4]);
        }
    }
    out
}

/// The scales (or offsets) of one group's block: eight f16, one per row.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(16))]
pub(crate) struct Half8(pub [u16; G]);

impl Half8 {
    /// From per-row f32 values that must be f16 values (they come from
    /// GGUF f16 fields, or are a power-of-two multiple of one).
    pub(crate) fn exact(v: [f32; G]) -> Result<Self, Error> {
        let mut out = Half8::default();
        for (o, &x) in out.0.iter_mut().zip(&v) {
            let h = f16::from_f32(x);
            if h.to_f32() != x {
                return Err(Error(format!("block scale {x} is not an f16 value")));
            }
            *o = h.to_bits();
        }
        Ok(out)
    }

    /// `values[i]` for each row's source block `i` (see [`group_rows`]), 0
    /// for padding rows; as [`Half8::exact`].
    pub(crate) fn gather(rows: [Option<usize>; G], values: &[f32]) -> Result<Self, Error> {
        Self::exact(rows.map(|i| i.map_or(0.0, |i| values[i])))
    }

    pub(crate) fn get(&self, l: usize) -> f32 {
        f16::from_bits(self.0[l]).to_f32()
    }

    /// The eight values as f32 lanes.
    ///
    /// # Safety
    /// F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn load(&self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_load_si128(self.0.as_ptr() as *const __m128i))
    }
}

/// The per-row values `v` (`v[r * per_row + t]`) of every group block, as
/// eight lanes (0 for padding rows).
pub(crate) fn lanes<T: Copy + Default>(v: &[T], n: usize, per_row: usize) -> Vec<[T; G]> {
    group_blocks(n, per_row)
        .map(|rows| rows.map(|i| i.map_or(T::default(), |i| v[i])))
        .collect()
}

/// [`Half8::gather`] over every group block of `n` rows of `per_row`
/// values `v` (`v[r * per_row + t]`).
pub(crate) fn half_lanes(v: &[f32], n: usize, per_row: usize) -> Result<Vec<Half8>, Error> {
    let blocks = group_blocks(n, per_row);
    let mut out = Vec::with_capacity(blocks.len());
    for rows in blocks {
        out.push(Half8::gather(rows, v)?);
    }
    Ok(out)
}

/// How far ahead, in bytes of its main value plane, a kernel over a few
/// activation rows (decoding sequences) prefetches its weights into L2
/// ([`Group8::prefetch_ahead`]); [`PREFETCH_L1_BYTES`] ahead it asks again
/// for L1. The matrices are read in parallel in pieces of 16 rows; the
/// hardware prefetchers restart at every piece and lag behind, and asking
/// ahead keeps more of the memory bus busy. The distance is what keeps
/// enough lines in flight to cover memory's latency: streaming 4-bit
/// weights, 1 KiB (the first setting) read at 64-76% of `memory/read`'s
/// rate, 8 KiB at 81-90%, and farther was no faster. Into L1 alone, each
/// line held one of the core's few L1 fill buffers for the whole trip to
/// memory; into L2 the requests wait in L2's deeper queue instead and the
/// short L1 hop is from L2: on an Intel Xeon with a busy host, 8B Q4_K_M
/// decode 1.11-1.28x in seven of eight pairs (1.00x in one), 1B Q4_K_M
/// 0.995-1.29x, 1B Q8_0 1.04-1.11x against 8 KiB into L1; 8B Q8_0 and the
/// default model (in cache) unchanged (`benches/README.md`, `benches/HISTORY.md`).
pub(crate) const PREFETCH_BYTES: usize = 8 << 10;

/// How far ahead a kernel that prefetches into L2 ([`PREFETCH_BYTES`])
/// asks for its weights in L1.
pub(crate) const PREFETCH_L1_BYTES: usize = 1 << 10;

/// [`PREFETCH_BYTES`] in blocks of a plane whose blocks are `T`.
pub(crate) const fn prefetch_blocks<T>() -> usize {
    PREFETCH_BYTES / std::mem::size_of::<T>()
}

/// Asks for the `lines` cache lines from element `i` of `v` into the cache
/// `HINT` names. A hint: any `i` (past the end it names addresses that are
/// never read, which does not fault).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn hint<const HINT: i32, T>(v: &[T], i: usize, lines: usize) {
    use std::arch::x86_64::_mm_prefetch;
    let p = v.as_ptr().wrapping_add(i).cast::<i8>();
    for line in 0..lines {
        // SAFETY: a prefetch hint never faults, whatever the address.
        unsafe { _mm_prefetch::<HINT>(p.wrapping_add(64 * line)) };
    }
}

/// Activation rows up to which the kernels run on 256-bit tiles (at most
/// 4 rows, so each weight block is read once), prefetching their weights:
/// a decode step of a few sequences, bound by memory. More rows go to the
/// 512-bit kernels of [`wide`]: below 5 rows, unpacking a chunk's blocks
/// once for all tiles cost more than it saved (1B Q4_K_M decode of 2 and 4
/// sequences 1.7-1.9x faster on the 256-bit tiles), and unpacking each
/// block per tile, as those kernels do up to 16 rows, was slower too (1B
/// Q4_K_M and Q8_0 decode of 1 to 4 sequences 1.04-1.22x faster here).
pub(crate) const PREFETCH_MAX_ROWS: usize = 4;

/// A 256-bit tile's `VNNI` parameter: AVX2's `vpmaddubsw`, no `vpdpbusd`.
pub(crate) const NO_VNNI: u8 = 0;
/// `vpdpbusd` of AVX-512 VNNI + VL (EVEX-encoded).
pub(crate) const VNNI_512: u8 = 1;
/// `vpdpbusd` of AVX-VNNI (VEX-encoded): CPUs with VNNI but without
/// AVX-512, such as Intel's client cores since Alder Lake. The same
/// operation as [`VNNI_512`]'s, in an encoding the other CPUs may lack.
pub(crate) const VNNI_VEX: u8 = 2;

/// An interleaved matrix's kernels.
pub(crate) trait Group8 {
    /// Whether values 16..32 of a block have a factor of their own.
    const HALVES: bool;

    /// Whether the layout meets activations with one scale per 256 values
    /// ([`crate::Format::activation_span`]) and sums each span's eight
    /// blocks in integers before its float operations.
    const SPAN256: bool = false;

    /// Blocks in [`PREFETCH_BYTES`] of the layout's main value plane.
    const AHEAD: usize;

    /// Real rows.
    fn rows(&self) -> usize;

    /// Asks for block `i`'s values and scales to be brought into the cache
    /// `HINT` names (`_MM_HINT_T0`: L1, `_MM_HINT_T1`: L2). A hint: any
    /// `i` (past the matrix's end it names addresses that are never read,
    /// which does not fault).
    #[cfg(target_arch = "x86_64")]
    fn prefetch<const HINT: i32>(&self, i: usize);

    /// The prefetches of a kernel over a few activation rows at block `i`:
    /// [`PREFETCH_BYTES`] ahead into L2, [`PREFETCH_L1_BYTES`] ahead into
    /// L1.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch_ahead(&self, i: usize) {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1};
        self.prefetch::<_MM_HINT_T1>(i + Self::AHEAD);
        self.prefetch::<_MM_HINT_T0>(i + Self::AHEAD * PREFETCH_L1_BYTES / PREFETCH_BYTES);
    }

    /// Whether prompt steps (more than [`PREFETCH_MAX_ROWS`] activation
    /// rows) on the AVX-VNNI tiles run tiles of eight activation rows: a
    /// value register then meets eight rows instead of four, which halves
    /// the unpacking and scale work per row. Only for tiles that keep
    /// eight rows' sums in sixteen registers (Q4_K and Q5_K over 256-value
    /// activation spans). Q6_K's tile, with two sums per row, would
    /// not: taking eight rows a half block at a time it ran 0.75-0.87x.
    #[cfg(target_arch = "x86_64")]
    fn tall_tiles(&self, _acts: &Acts) -> bool {
        false
    }

    /// Blocks per row.
    fn blocks(&self) -> usize;

    /// Value `j` (0..32) of row `l` of group block `i`, as stored.
    fn q(&self, i: usize, l: usize, j: usize) -> i32;

    /// Factor of value `j` of row `l` of group block `i` and the row's
    /// offset there (`w = f q + m`).
    fn scale_offset(&self, i: usize, l: usize, j: usize) -> (f32, f32);

    /// Row `8 g + l` . activation row `a`, exactly summed per block (or half
    /// block, with [`Group8::HALVES`]) in i32 (the portable kernel).
    fn dot(&self, acts: &Acts, g: usize, l: usize, a: usize) -> f32 {
        dot_blocks(self, acts, g, l, a)
    }

    /// Appends row `r` as f32 (`blocks * 32` values).
    fn dequantize_row(&self, r: usize, out: &mut Vec<f32>) {
        let (nb, g, l) = (self.blocks(), r / G, r % G);
        out.reserve(nb * QK);
        for b in 0..nb {
            let i = g * nb + b;
            out.extend((0..QK).map(|j| {
                let (f, m) = self.scale_offset(i, l, j);
                f * self.q(i, l, j) as f32 + m
            }));
        }
    }

    /// Group `g` times activation rows `a..a + A`: lane `l` of `[j]` is row
    /// `8 g + l` . activation row `a + j`. Implementations are
    /// `#[inline(always)]`, compiled into the callers of [`simd`], which
    /// enable the instruction sets.
    ///
    /// With `PREFETCH`, each block also asks for the weights ahead
    /// ([`Group8::prefetch_ahead`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C, and the `vpdpbusd` that `VNNI` names
    /// ([`VNNI_512`], [`VNNI_VEX`]; [`NO_VNNI`] for none); the group and
    /// the activation rows exist.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const A: usize, const VNNI: u8, const PREFETCH: bool>(
        &self,
        acts: &Acts,
        g: usize,
        a: usize,
    ) -> [std::arch::x86_64::__m256; A];

    /// How the 512-bit kernels sum this layout's unpacked blocks.
    #[cfg(target_arch = "x86_64")]
    const SUMS: wide::Sums;

    /// Block `i0` of one group and `i1` of the next (the same block of
    /// groups `g` and `g + 1`) unpacked for the 512-bit kernels ([`wide`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; both blocks exist.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_pair(&self, i0: usize, i1: usize) -> wide::Unpacked;

    /// With [`wide::Sums::Mins16`], the 16-value integer mins of blocks
    /// `i0` and `i1` (the same block of two groups) as 16-bit pairs, one
    /// pair per row lane; the other layouts have none (zero).
    ///
    /// # Safety
    /// AVX-512 F/BW; both blocks exist.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn mins2(&self, _i0: usize, _i1: usize) -> std::arch::x86_64::__m512i {
        std::arch::x86_64::_mm512_setzero_si512()
    }
}

/// [`Group8::dot`]'s portable kernel, for the layouts that override it to
/// call it for some activations.
pub(crate) fn dot_blocks<W: Group8 + ?Sized>(
    w: &W,
    acts: &Acts,
    g: usize,
    l: usize,
    a: usize,
) -> f32 {
    let nb = w.blocks();
    let mut acc = 0f32;
    // With `SPAN256`, the span's integer sum so far.
    let mut span = 0i32;
    for b in 0..nb {
        let (i, ai) = (g * nb + b, a * nb + b);
        let x = &acts.qs[ai].0;
        let isum = |js: Range<usize>| -> i32 { js.map(|j| w.q(i, l, j) * x[j] as i32).sum() };
        let (f, m) = w.scale_offset(i, l, 0);
        let dx = acts.d[ai];
        if W::SPAN256 {
            // One factor per span (see `SPAN256`), no offsets.
            span += isum(0..QK);
            if b % SPAN_BLOCKS == SPAN_BLOCKS - 1 {
                acc += f * dx * span as f32;
                span = 0;
            }
            continue;
        }
        acc += if W::HALVES {
            let f1 = w.scale_offset(i, l, QK / 2).0;
            f * dx * isum(0..QK / 2) as f32 + f1 * dx * isum(QK / 2..QK) as f32
        } else {
            f * dx * isum(0..QK) as f32
        } + m * acts.s[ai];
    }
    acc
}

/// Stores the rows of group `g` that exist (`t[l][j]` to `out[a + j][8 g +
/// l]`).
///
/// # Safety
/// Nobody else writes the group's columns of `out` meanwhile; the buffer is
/// alive.
unsafe fn put_group<const A: usize>(n: usize, g: usize, a: usize, t: [[f32; A]; G], out: Out) {
    let r = G * g;
    if r + G <= n {
        // SAFETY: forwarded.
        unsafe { out.put(r, a, t) };
    } else {
        for (l, row) in t.iter().enumerate().take(n - r) {
            // SAFETY: forwarded.
            unsafe { out.put::<1, A>(r + l, a, [*row]) };
        }
    }
}

/// The activation rows of the next tile, at most `most` (8, 4, 2 or 1),
/// from `left` rows.
#[inline(always)]
pub(crate) fn tile_rows(left: usize, most: usize) -> usize {
    match left {
        8.. if most >= 8 => 8,
        4.. if most >= 4 => 4,
        2.. if most >= 2 => 2,
        _ => 1,
    }
}

/// Groups `groups` times every activation row with [`Group8::dot`].
///
/// # Safety
/// As [`put_group`] for the groups' columns.
pub(crate) unsafe fn run_scalar<W: Group8>(w: &W, acts: &Acts, groups: Range<usize>, out: Out) {
    let m = acts.rows();
    for g in groups {
        for a in 0..m {
            let t = std::array::from_fn(|l| [w.dot(acts, g, l, a)]);
            // SAFETY: forwarded.
            unsafe { put_group(w.rows(), g, a, t, out) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{put_group, Group8, G, NO_VNNI, PREFETCH_MAX_ROWS, VNNI_512, VNNI_VEX};
    use crate::act::Acts;
    use crate::Out;

    /// Computes and stores one tile.
    #[inline(always)]
    pub(super) unsafe fn put_tile<W: Group8, const A: usize, const VNNI: u8, const PF: bool>(
        w: &W,
        acts: &Acts,
        g: usize,
        a: usize,
        out: Out,
    ) {
        let v = w.tile::<A, VNNI, PF>(acts, g, a);
        let r = G * g;
        if r + G <= w.rows() {
            // A whole group: each activation row's eight columns at once.
            for (j, v) in v.iter().enumerate() {
                // SAFETY: `row` checks the bounds; the columns are the caller's.
                _mm256_storeu_ps(out.row(r, a + j, G), *v);
            }
            return;
        }
        let mut lanes = [[0f32; G]; A];
        for (l, v) in lanes.iter_mut().zip(v) {
            _mm256_storeu_ps(l.as_mut_ptr(), v);
        }
        let t: [[f32; A]; G] = std::array::from_fn(|l| std::array::from_fn(|j| lanes[j][l]));
        put_group(w.rows(), g, a, t, out);
    }

    /// Groups `groups` times every activation row on 256-bit tiles of up
    /// to 4 activation rows.
    #[inline(always)]
    unsafe fn run_body<W: Group8, const VNNI: u8>(
        w: &W,
        acts: &Acts,
        groups: Range<usize>,
        out: Out,
    ) {
        let m = acts.rows();
        let tall = VNNI == VNNI_VEX && m > PREFETCH_MAX_ROWS && w.tall_tiles(acts);
        let mut a = 0;
        while a < m {
            // Any 1 to 4 rows are one tile (three not as two and one: with
            // weights from memory, each tile is a pass over them; decode of
            // 3 sequences 1.21-1.28x faster); eight where `tall`, the last
            // rows by up to four.
            let at = if tall && m - a >= 8 {
                8
            } else {
                (m - a).min(4)
            };
            for g in groups.clone() {
                match (at, m <= PREFETCH_MAX_ROWS) {
                    (8, _) => put_tile::<W, 8, VNNI, false>(w, acts, g, a, out),
                    (4, true) => put_tile::<W, 4, VNNI, true>(w, acts, g, a, out),
                    (4, false) => put_tile::<W, 4, VNNI, false>(w, acts, g, a, out),
                    (3, true) => put_tile::<W, 3, VNNI, true>(w, acts, g, a, out),
                    (3, false) => put_tile::<W, 3, VNNI, false>(w, acts, g, a, out),
                    (2, true) => put_tile::<W, 2, VNNI, true>(w, acts, g, a, out),
                    (2, false) => put_tile::<W, 2, VNNI, false>(w, acts, g, a, out),
                    (_, true) => put_tile::<W, 1, VNNI, true>(w, acts, g, a, out),
                    (_, false) => put_tile::<W, 1, VNNI, false>(w, acts, g, a, out),
                }
            }
            a += at;
        }
    }

    /// Groups `groups` times every activation row, AVX2.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; as [`super::run_scalar`] for `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn run_avx2<W: Group8>(w: &W, acts: &Acts, groups: Range<usize>, out: Out) {
        // The tiles spill on sixteen registers: aligned slots
        // (`crate::frame`).
        crate::align_frame!();
        run_body::<W, NO_VNNI>(w, acts, groups, out)
    }

    /// [`run_avx2`] with AVX-VNNI's `vpdpbusd` on 256-bit tiles of up to
    /// 4 activation rows, for every step (CPUs without AVX-512).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-VNNI; as [`super::run_scalar`] for `out`.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub(crate) unsafe fn run_avxvnni<W: Group8>(
        w: &W,
        acts: &Acts,
        groups: Range<usize>,
        out: Out,
    ) {
        // As `run_avx2`'s (not in `run_vnni`, whose prompt steps run the
        // 512-bit kernels, which realign their own frames, and whose
        // decode measured no better with it).
        crate::align_frame!();
        run_body::<W, VNNI_VEX>(w, acts, groups, out)
    }

    /// `acc` plus the sums of four products of `u`'s unsigned bytes and
    /// `s`'s signed ones per 32-bit lane: the `vpdpbusd` that `VNNI`
    /// names ([`VNNI_512`] or [`VNNI_VEX`]).
    ///
    /// # Safety
    /// The CPU has that instruction (and the caller enables it).
    #[inline(always)]
    pub(crate) unsafe fn dpbusd<const VNNI: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        match VNNI {
            VNNI_512 => _mm256_dpbusd_epi32(acc, u, s),
            VNNI_VEX => _mm256_dpbusd_avx_epi32(acc, u, s),
            _ => unreachable!("vpdpbusd without VNNI"),
        }
    }

    /// [`run_avx2`] with `vpdpbusd` (AVX-512 VNNI): on 256-bit registers
    /// for up to [`PREFETCH_MAX_ROWS`] activation rows (decode, bound by
    /// memory), and the 512-bit kernels of [`super::wide`] for more (with
    /// `AMX`, AMX tiles for their whole tiles of 16 rows, [`super::amx`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI, and [`super::amx::available`]
    /// with `AMX`; as [`super::run_scalar`] for `out`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn run_vnni<W: Group8, const AMX: bool>(
        w: &W,
        acts: &Acts,
        groups: Range<usize>,
        out: Out,
    ) {
        if acts.rows() > PREFETCH_MAX_ROWS {
            super::wide::run::<W, AMX>(w, acts, groups, out)
        } else {
            run_body::<W, VNNI_512>(w, acts, groups, out)
        }
    }
}
