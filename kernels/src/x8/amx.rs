//! AMX int8 tiles (Intel Xeon from Sapphire Rapids on) for prompt steps:
//! the integer sums of [`super::wide`]'s 512-bit tiles, 16 activation rows
//! by 16 weight rows (a group pair) at once, by `tdpbsud`.
//!
//! A chunk's blocks are unpacked into scratch as for the 512-bit kernels
//! ([`Unpacked`]); register `v` of a block holds values `4 v..4 v + 4` of
//! the pair's sixteen rows, which is exactly row `v` of an AMX `B` tile
//! (`K/4` rows of sixteen 4-byte columns), so the eight registers are the
//! block's `B` tile as they lie. The `A` tile is the 16 activation rows'
//! quantized block, 32 signed bytes each ([`Acts::tiles16`] puts a tile's
//! rows side by side, so that it is 512 contiguous bytes), and `tdpbsud`
//! (signed `A` times unsigned `B`) leaves in row `j`, column `l` of `C` the
//! integer sum of activation row `a + j` against weight row `l` over the
//! block: lane `l` of the 512-bit tile's sum for that row. Q8_0, unpacked
//! with a bias for `vpdpbusd` (`q + 128`), has it taken off its unpacked
//! blocks for the AMX tiles ([`unbias`]) and runs on `tdpbssd` (signed
//! times signed), which leaves exactly the 512-bit tile's sum started from
//! its bias correction ([`crate::act::Bias`]); before, a second product of
//! the same `A` with a constant tile of the bias's negative did, one
//! `tdpbssd` more per product (`matmul/Q8_0` 1.00-1.07x faster without
//! it). Q3_K's span sums (`p + 127`, where `p = 128` does not fit a signed
//! byte) start from the span's correction, as on the 512-bit tiles. Q6_K's
//! values times their 16-value scales (`w = sc q`, up to 4096) are split
//! into two bytes, `w = 128 h + l` ([`split6`]), whose products (`tdpbssd`
//! for `h`, `tdpbsud` for `l`) add up over a span in two `C` tiles: the
//! span's exact integer sum, as the 512-bit tiles reach it with
//! `vpmulld`. The sums then take [`finish`]'s float operations (Q4_K's
//! and Q5_K's, [`finish_span`]'s; the span layouts', the 512-bit
//! [`super::wide`] `tile_span`'s) in the same order, so the results are
//! the 512-bit tiles' bits.
//!
//! Each step's sums are stored (`tilestored`) while the previous step's
//! are read back for the float operations, which is what the loop waits on:
//! a row's sum times its factors, added to its accumulator, per block
//! (Q3_K: per span, its `C` tiles adding up the span's eight blocks).
//!
//! Layouts: all but Q2_K ([`Sums::Mins16`]), whose mins take sixteen more
//! integer sums per block and stay on the 512-bit tiles.
//!
//! Linux grants the tiles' register state to a process on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); [`available`] asks once.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::wide::{finish, finish_span, Sums, Unpacked};
use super::{Group8, G, SPAN_BLOCKS};
use crate::act::{tiled_at, Acts};
use crate::formats::QK;

/// Activation rows per tile.
pub(crate) const ROWS: usize = 16;

/// Whether this CPU has AMX int8 tiles and the kernel lets this process
/// use them (asked once).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(detect)
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    // CPUID leaf 7: AMX-TILE is bit 24 of EDX, AMX-INT8 bit 25.
    let leaf7 = __cpuid_count(7, 0);
    if (leaf7.edx >> 24) & 3 != 3 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call; it fails (non-zero) where the kernel
    // does not support the tiles' state.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

/// Whether the tiles run the layouts summed as `sums`.
pub(crate) fn supports(sums: Sums) -> bool {
    sums != Sums::Mins16
}

/// [`supports`] for layout `W`'s sums.
pub(crate) fn takes<W: Group8>(_: &W) -> bool {
    supports(W::SUMS)
}

/// A tile configuration (palette 1), as `ldtilecfg` reads it.
#[repr(C, align(64))]
pub(crate) struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl Config {
    /// `tmm0`, `tmm1`: sums (16 rows of 16 i32); `tmm2`, `tmm3`: activation
    /// bytes (16 rows of a block's 32 values); `tmm4`, `tmm5`: weight bytes
    /// (8 rows of 64).
    const fn new() -> Self {
        let k = QK;
        let (sums, acts, weights) = (
            (64, ROWS as u8),
            (k as u16, ROWS as u8),
            (64, (k / 4) as u8),
        );
        Self::of(&[sums, sums, acts, acts, weights, weights])
    }

    /// Tile `t` with `shapes[t]` (bytes per row, rows); the rest unused.
    pub(crate) const fn of(shapes: &[(u16, u8)]) -> Self {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut t = 0;
        while t < shapes.len() {
            (cfg.colsb[t], cfg.rows[t]) = shapes[t];
            t += 1;
        }
        cfg
    }

    /// Loads this configuration on the calling thread.
    ///
    /// # Safety
    /// [`available`]; [`release`] before the thread does anything else with
    /// tiles.
    #[inline(always)]
    pub(crate) unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self, options(nostack, readonly));
    }
}

static WHOLE: Config = Config::new();

/// Loads the tile configuration `W`'s sums take on this thread.
///
/// # Safety
/// [`available`]; [`release`] before the thread does anything else with
/// tiles.
#[inline(always)]
pub(crate) unsafe fn configure<W: Group8>() {
    WHOLE.load();
}

/// Gives the tiles' state back (the kernel then need not save it).
///
/// # Safety
/// [`available`].
#[inline(always)]
pub(crate) unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// 16 rows of 16 integer sums, as a tile stores them.
#[repr(C, align(64))]
struct SumTile([[i32; 16]; ROWS]);

impl SumTile {
    /// Row `j` as one register.
    #[inline(always)]
    unsafe fn row(&self, j: usize) -> __m512i {
        _mm512_load_si512(self.0[j].as_ptr().cast())
    }
}

/// Whether layout `W`'s unpacked values carry a bias that the AMX tiles
/// take off ([`unbias`]): Q8_0's `q + 128`.
pub(crate) fn signed<W: Group8>() -> bool {
    W::SUMS == Sums::All128
}

/// Takes the bias of a [`signed`] layout off every unpacked block's values
/// (from `q + 128` to `q`, as signed bytes), or puts it back: flipping
/// each byte's top bit does either; the other layouts' blocks are left as
/// they are.
///
/// # Safety
/// AVX-512 F/BW.
#[inline(always)]
pub(crate) unsafe fn unbias<W: Group8>(blocks: &mut [Unpacked]) {
    if !signed::<W>() {
        return;
    }
    // A loop, not `iter_mut().for_each`: a closure would be compiled
    // without the caller's AVX-512.
    for u in blocks {
        for w in &mut u.w {
            *w = _mm512_xor_si512(*w, _mm512_set1_epi8(i8::MIN));
        }
    }
}

/// Q6_K's unpacked blocks ([`Sums::Span6`]: `q + 32`, the two 16-value
/// scales as 16-bit pairs in `m`) as their values times their scales, `w
/// = sc q` (in -4064..=4096), split into bytes `w = 128 h + l`: into `lo`
/// the `l` (unsigned, 0..128), into `hi` the `h` (signed, -32..=32), both
/// cleared first and each keeping the block's `d`.
///
/// # Safety
/// AVX-512 F/BW.
#[inline(always)]
pub(crate) unsafe fn split6(blocks: &[Unpacked], lo: &mut Vec<Unpacked>, hi: &mut Vec<Unpacked>) {
    lo.clear();
    hi.clear();
    let low7 = _mm512_set1_epi16(0x7F);
    let low8 = _mm512_set1_epi16(0xFF);
    let bias = _mm512_set1_epi8(32);
    for u in blocks {
        // Each row's two scales in both 16-bit halves of its lane.
        let pairs = _mm512_castps_si512(u.m);
        let sc0 = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pairs));
        let sc1 = _mm512_srai_epi32::<16>(pairs);
        let scale = [
            _mm512_or_si512(
                _mm512_and_si512(sc0, _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<16>(sc0),
            ),
            _mm512_or_si512(
                _mm512_and_si512(sc1, _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<16>(sc1),
            ),
        ];
        let (mut l, mut h) = (*u, *u);
        for v in 0..G {
            let q = _mm512_sub_epi8(u.w[v], bias);
            let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(q));
            let odd = _mm512_srai_epi16::<8>(q);
            let sc = scale[v / 4];
            let (pe, po) = (_mm512_mullo_epi16(even, sc), _mm512_mullo_epi16(odd, sc));
            l.w[v] = _mm512_or_si512(
                _mm512_and_si512(pe, low7),
                _mm512_slli_epi16::<8>(_mm512_and_si512(po, low7)),
            );
            h.w[v] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srai_epi16::<7>(pe), low8),
                _mm512_slli_epi16::<8>(_mm512_srai_epi16::<7>(po)),
            );
        }
        lo.push(l);
        hi.push(h);
    }
}

/// Sums of activation rows `$x0` (the first row's block, the rows
/// `$stride` bytes apart) against weight bytes `$w0` (rows 64 bytes apart)
/// added to `tmm0`, and of `$x1` against `$w1` to `tmm1`: with `signed`,
/// signed weights (`tdpbssd`), else unsigned (`tdpbsud`); with `zero`, the
/// two start from zero.
macro_rules! dot2 {
    ($zero:expr, $signed:expr, $x0:expr, $w0:expr, $x1:expr, $w1:expr, $stride:expr) => {
        if $zero {
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        }
        asm!(
            "tileloadd tmm2, [{x0} + {st}*1]",
            "tileloadd tmm4, [{w0} + {s64}*1]",
            "tileloadd tmm3, [{x1} + {st}*1]",
            "tileloadd tmm5, [{w1} + {s64}*1]",
            x0 = in(reg) $x0,
            w0 = in(reg) $w0,
            x1 = in(reg) $x1,
            w1 = in(reg) $w1,
            st = in(reg) $stride,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        );
        if $signed {
            asm!(
                "tdpbssd tmm0, tmm2, tmm4",
                "tdpbssd tmm1, tmm3, tmm5",
                options(nostack, nomem)
            );
        } else {
            asm!(
                "tdpbsud tmm0, tmm2, tmm4",
                "tdpbsud tmm1, tmm3, tmm5",
                options(nostack, nomem)
            );
        }
    };
}

/// Stores `tmm0` into `c0` and `tmm1` into `c1`.
#[inline(always)]
unsafe fn store2(c0: &mut SumTile, c1: &mut SumTile) {
    asm!(
        "tilestored [{c0} + {s64}*1], tmm0",
        "tilestored [{c1} + {s64}*1], tmm1",
        c0 = in(reg) c0.0.as_mut_ptr(),
        c1 = in(reg) c1.0.as_mut_ptr(),
        s64 = in(reg) 64usize,
        options(nostack),
    );
}

/// Groups `g` and `g + 1` (every block unpacked in `blocks`; for Q6_K,
/// [`split6`]'s low bytes in `blocks` and high bytes in `hi`, else `hi`
/// empty) times activation rows `a..a + 16` (in row order, or regrouped by
/// tiles of 16: [`Acts::tiles16`]), as the 512-bit tile of 16 rows would
/// give them (the same bits): lanes 0..8 of `[j]` for group `g`, 8..16 for
/// `g + 1`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AMX-INT8 with [`configure`]`::<W>()` done on this
/// thread; [`supports`]`(W::SUMS)`; `blocks` (and for Q6_K `hi`) holds the
/// pair's every block, with the bias of [`signed`] layouts taken off
/// ([`unbias`]); the activation rows exist, in row order or in a tile of
/// 16 from `a`, and have as many blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
pub(crate) unsafe fn tile<W: Group8, const TILED: bool>(
    blocks: &[Unpacked],
    hi: &[Unpacked],
    acts: &Acts,
    a: usize,
) -> [__m512; ROWS] {
    let nb = acts.nb;
    let six = W::SUMS == Sums::Span6;
    assert!(
        acts.tiled == TILED
            && (!TILED || acts.tiles16)
            && blocks.len() == nb
            && (!six || hi.len() == nb)
            && (a + ROWS) * nb <= acts.qs.len()
            && supports(W::SUMS)
            && std::mem::size_of::<crate::formats::Q8>() == QK
    );
    // Where row `a + j`'s element `e` (of `per` per row) is: with the rows
    // regrouped by tiles of 16, the tile's rows side by side, so that a
    // block's `A` tile is 512 contiguous bytes; in row order (a matrix
    // whose last group is alone), `nb` blocks apart.
    let at = |per: usize, j: usize, e: usize| {
        if TILED {
            tiled_at(per, a, ROWS, j, e)
        } else {
            (a + j) * per + e
        }
    };
    let stride = if TILED { QK } else { nb * QK };
    let x = |b: usize| acts.qs.as_ptr().add(at(nb, 0, b)).cast::<u8>();
    let wb = |b: usize| blocks.as_ptr().add(b).cast::<u8>();
    let hb = |b: usize| hi.as_ptr().add(b).cast::<u8>();
    let mut acc = [_mm512_setzero_ps(); ROWS];
    // Two pairs of sum tiles' stores: each step's tiles are stored into
    // one while the previous step's sums are read from the other, so the
    // float work does not wait on the step's products.
    let mut bufs = [
        [SumTile([[0; 16]; ROWS]), SumTile([[0; 16]; ROWS])],
        [SumTile([[0; 16]; ROWS]), SumTile([[0; 16]; ROWS])],
    ];
    // `$body` for each row `$j`, unrolled, so that the accumulators stay
    // in registers (a loop kept them on the stack).
    macro_rules! rows {
        ($j:ident; $body:block) => {
            rows!(@ $j; $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
        };
        (@ $j:ident; $body:block; $($n:literal)*) => {$({
            let $j: usize = $n;
            $body
        })*};
    }
    // The layouts whose bias [`unbias`] took off.
    let signed = signed::<W>();
    // Each row's sums (whole, with their bias corrections) and float
    // operations, as `tile_unpacked` does them.
    macro_rules! finish_rows {
        ($b:expr, $c0:expr, $c1:expr) => {
            rows!(j; {
                let ai = at(nb, j, $b);
                let s = [$c0.row(j), $c1.row(j)];
                acc[j] = finish::<W>(blocks.get_unchecked($b), acts, ai, s, acc[j]);
            })
        };
    }
    match W::SUMS {
        Sums::Span6 => {
            // A span per step: each block's `A` tile against its low bytes
            // into `tmm0` and its high bytes into `tmm1`, added up over the
            // span; the span's sum is `128 tmm1 + tmm0`.
            assert!(acts.span == 256 && nb.is_multiple_of(SPAN_BLOCKS));
            let spans = nb / SPAN_BLOCKS;
            for t in 0..=spans {
                if t < spans {
                    let first = t * SPAN_BLOCKS;
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    for b in first..first + SPAN_BLOCKS {
                        asm!(
                            "tileloadd tmm2, [{x} + {st}*1]",
                            "tileloadd tmm4, [{l} + {s64}*1]",
                            "tileloadd tmm5, [{h} + {s64}*1]",
                            "tdpbsud tmm0, tmm2, tmm4",
                            "tdpbssd tmm1, tmm2, tmm5",
                            x = in(reg) x(b),
                            l = in(reg) wb(b),
                            h = in(reg) hb(b),
                            st = in(reg) stride,
                            s64 = in(reg) 64usize,
                            options(nostack, readonly),
                        );
                    }
                    let [c0, c1] = &mut bufs[t % 2];
                    store2(c0, c1);
                }
                if t > 0 {
                    let [c0, c1] = &bufs[(t - 1) % 2];
                    let last = t * SPAN_BLOCKS - 1;
                    let u = blocks.get_unchecked(last);
                    rows!(j; {
                        let s = _mm512_add_epi32(_mm512_slli_epi32::<7>(c1.row(j)), c0.row(j));
                        let dx = _mm512_set1_ps(*acts.d.get_unchecked(at(nb, j, last)));
                        acc[j] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(u.d, dx), acc[j]);
                    });
                }
            }
        }
        Sums::All127 => {
            // A span per step: its even blocks into `tmm0`, odd into
            // `tmm1`; the two added (exact) and started from the span's
            // bias.
            let spans = nb / SPAN_BLOCKS;
            for t in 0..=spans {
                if t < spans {
                    let first = t * SPAN_BLOCKS;
                    for b in (first..first + SPAN_BLOCKS).step_by(2) {
                        dot2!(b == first, false, x(b), wb(b), x(b + 1), wb(b + 1), stride);
                    }
                    let [c0, c1] = &mut bufs[t % 2];
                    store2(c0, c1);
                }
                if t > 0 {
                    let [c0, c1] = &bufs[(t - 1) % 2];
                    let last = t * SPAN_BLOCKS - 1;
                    let u = blocks.get_unchecked(last);
                    rows!(j; {
                        let start = *acts.start127.get_unchecked(at(spans, j, t - 1));
                        let s = _mm512_add_epi32(
                            _mm512_set1_epi32(start),
                            _mm512_add_epi32(c0.row(j), c1.row(j)),
                        );
                        let dx = _mm512_set1_ps(*acts.d.get_unchecked(at(nb, j, last)));
                        acc[j] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(u.d, dx), acc[j]);
                    });
                }
            }
        }
        Sums::SpanOffsets => {
            // Two blocks per step, as below (spans of eight blocks: never
            // an odd last one), each row's blocks into its span sum.
            assert!(acts.span == 256 && nb.is_multiple_of(SPAN_BLOCKS));
            let mut sp = [_mm512_setzero_ps(); ROWS];
            let steps = nb / 2;
            for i in 0..=steps {
                if i < steps {
                    let (b0, b1) = (2 * i, 2 * i + 1);
                    dot2!(true, false, x(b0), wb(b0), x(b1), wb(b1), stride);
                    let [c0, c1] = &mut bufs[i % 2];
                    store2(c0, c1);
                }
                if i > 0 {
                    let b = 2 * (i - 1);
                    let [c0, c1] = &bufs[(i - 1) % 2];
                    let (u0, u1) = (blocks.get_unchecked(b), blocks.get_unchecked(b + 1));
                    let last = (b + 1) % SPAN_BLOCKS == SPAN_BLOCKS - 1;
                    rows!(j; {
                        finish_span(u0, acts, at(nb, j, b), c0.row(j), false, &mut sp[j], &mut acc[j]);
                        finish_span(u1, acts, at(nb, j, b + 1), c1.row(j), last, &mut sp[j], &mut acc[j]);
                    });
                }
            }
        }
        _ => {
            // Two blocks per step (one in each sum tile); an odd last
            // block twice, its second sums not read.
            let steps = nb.div_ceil(2);
            for i in 0..=steps {
                if i < steps {
                    let (b0, b1) = (2 * i, (2 * i + 1).min(nb - 1));
                    dot2!(true, signed, x(b0), wb(b0), x(b1), wb(b1), stride);
                    let [c0, c1] = &mut bufs[i % 2];
                    store2(c0, c1);
                }
                if i > 0 {
                    let b = 2 * (i - 1);
                    let [c0, c1] = &bufs[(i - 1) % 2];
                    finish_rows!(b, c0, c0);
                    if b + 1 < nb {
                        finish_rows!(b + 1, c1, c1);
                    }
                }
            }
        }
    }
    if !matches!(W::SUMS, Sums::Offsets | Sums::SpanOffsets | Sums::Span6) {
        // As the 512-bit tiles: the signed layouts add their (zero)
        // offsets' sums last.
        for acc in &mut acc {
            *acc = _mm512_add_ps(*acc, _mm512_setzero_ps());
        }
    }
    acc
}
