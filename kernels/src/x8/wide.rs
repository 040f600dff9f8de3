//! The 512-bit kernels (AVX-512 VNNI), for more than four activation rows
//! (prefill, batched decode): compute, not memory, bounds those, and these
//! do twice the work per instruction of the 256-bit tiles.
//!
//! Two groups share each register: the same block of groups `g` and `g + 1`
//! in its two halves (lanes 0..8 and 8..16), so one broadcast activation
//! word and one `vpdpbusd` serve sixteen weight rows. Tiles are two groups x
//! up to 8 activation rows. Every layout unpacks a chunk's blocks once into
//! a per-thread scratch ([`Unpacked`]: the values as unsigned bytes, the
//! factors and offsets as f32 lanes) that every activation tile then reads
//! ([`tile_unpacked`]; 1B Q4_K_M prefill about 7% faster than unpacking in
//! registers per tile). Up to [`STREAM_MAX_ROWS`] activation rows (decode
//! of a few sequences), each tile unpacks each block in registers where it
//! uses it instead: the store and reload through scratch cost more than
//! unpacking again for a second tile.
//!
//! `vpdpbusd` multiplies unsigned weight bytes by signed activation bytes,
//! and AVX-512 has no `vpsignb` for the 256-bit kernels' sign trick, so the
//! signed layouts are unpacked with a bias, `q + 128` (Q8_0), `q + 32`
//! (Q6_K) or, for Q3_K's values times their 16-value scales, `p + 127`,
//! and each sum starts from the activation block's correction instead of
//! zero ([`crate::act::Bias`]: `-128 sum(x)`, `-127 sum(x)`, or `-32` times
//! each half block's sum), which leaves exactly `sum(q x)`. Q2_K's values
//! are unsigned already (times their scales at unpacking); its mins meet
//! the activations' half sums ([`Sums::Mins16`]). These two, and Q6_K in
//! prompt steps (each half block's sum times its scale, [`Sums::Span6`]),
//! meet activations with one scale per 256 values and sum a super-block's
//! eight blocks in integers before their float operations ([`tile_span`]).
//! Each lane thus
//! does the 256-bit tile's integer sums and float operations in the same
//! order, so the results are the same bits.
//!
//! On CPUs with AMX, [`run`] hands whole tiles of 16 activation rows to
//! [`super::amx`], which reads the same unpacked blocks.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::simd::put_tile;
use super::{put_group, tile_rows, Group8, G, SPAN_BLOCKS, VNNI_512};
use crate::act::{tiled_at, Acts};
use crate::{Format, Out};

/// Two 256-bit halves as one 512-bit register (`lo` in lanes 0..8).
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
pub(crate) unsafe fn join_ps(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ))
}

/// 32 bytes at `lo` and 32 at `hi` as one 512-bit register.
///
/// # Safety
/// AVX-512 F; both addresses are 32-byte aligned and readable.
#[inline(always)]
pub(crate) unsafe fn load_pair(lo: *const __m256i, hi: *const __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_load_si256(lo)),
        _mm256_load_si256(hi),
    )
}

/// One block of two groups, unpacked: register `v` of `w` holds values `4
/// v..4 v + 4` of the sixteen rows as unsigned bytes (biased as
/// [`Group8::SUMS`] says), `d` their factors and `m` their offsets
/// (`w = d q + m`), or with [`Sums::Span6`] the super-block's factor `d`
/// and (as bits) the two 16-value scales, or with [`Sums::Mins16`] the
/// factors of the mins.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Unpacked {
    pub w: [__m512i; G],
    pub d: __m512,
    pub m: __m512,
}

/// How [`tile_unpacked`] sums a layout's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sums {
    /// Q4_0, Q4_1, Q5_0 and Q5_1: `d_x d isum + m s_x` per block.
    Offsets,
    /// Q4_K's and Q5_K's 4- and 5-bit values over activations with one
    /// scale per span of 256 values: `d isum + m X` per block (`d` the
    /// block's factor `d sc`, `X` its activations' quant sum) into the
    /// span's sum, which takes the span's `d_x` once ([`finish_span`]).
    SpanOffsets,
    /// Q6_K's `q + 32` over activations with one scale per 256 values:
    /// each block's two half sums (each from `-32` times its half's
    /// `sum(x)`) times their integer 16-value scales (`vpmulld`, exact)
    /// into the span's integer sum, which takes `d d_x` once
    /// ([`tile_span`]), as the 256-bit tile without VNNI does. `Unpacked::d`
    /// holds the super-block's `d`, `Unpacked::m` (as bits) the two scales
    /// as 16-bit pairs (the first half's low).
    Span6,
    /// Q8_0's `q + 128`: one sum from `-128 sum(x)`.
    All128,
    /// Q3_K's values times their sub-block scales, `p + 127` (`p` in
    /// -124..=128): one sum per 256-value span from its `-127 sum(x)`
    /// ([`tile_span`]).
    All127,
    /// Q2_K's values times their sub-block scales (unsigned): one sum per
    /// span from zero with factor `d` (`Unpacked::d`), and the integer mins
    /// ([`Group8::mins2`]) times the activations' half sums with factor
    /// `-dmin` (`Unpacked::m`) ([`tile_span`]).
    Mins16,
}

impl Sums {
    /// Whether the 512-bit tiles sum a whole 256-value span in integers
    /// before its float operations ([`tile_span`]): Q3_K, Q2_K, Q6_K.
    pub(crate) const fn per_span(self) -> bool {
        matches!(self, Sums::All127 | Sums::Mins16 | Sums::Span6)
    }
}

/// Asks for block `b` of the group pair after `g, g + 1` (groups `g + 2`
/// and `g + 3`, the next chunk, usually this thread's next) to be brought
/// into L2; the first activation tile of a pair asks for each block of the
/// next as it goes. The next pair's bytes then come from memory while this
/// one's tiles compute, where before the unpacking waited on memory and
/// the tiles left it idle. Asked for in one burst during the unpacking
/// instead, they gained less than half as much (1B Q4_K_M decode of 8
/// sequences 166 tok/s, against 145 without and 210-220 spread over the
/// tile; `benches/README.md`, `benches/HISTORY.md`). Past the matrix's end they name addresses
/// that are never read.
#[inline(always)]
fn prefetch_next_pair<W: Group8>(w: &W, g: usize, b: usize) {
    let nb = w.blocks();
    w.prefetch::<_MM_HINT_T1>((g + 2) * nb + b);
    w.prefetch::<_MM_HINT_T1>((g + 3) * nb + b);
}

/// Activation rows up to which [`run`] unpacks each block where a tile
/// uses it instead of a chunk's blocks into scratch first (a tile of up to
/// 8 rows, or two): decode of 5 to 16 sequences 1.04-1.31x faster on the
/// 1B files (Q4_K_M, Q8_0, Q3_K_M, Q2_K) and 1.09-1.12x on 8B Q4_K_M,
/// the default model within 1% at 8-16; at 32 rows it lost 3% there and at
/// 64 rows and in prefill scratch wins (`benches/README.md`, `benches/HISTORY.md`).
const STREAM_MAX_ROWS: usize = 16;

/// Whether [`run`] takes `m` activation rows regrouped by tiles
/// ([`Acts::quantize_tiled`]) for a matrix of `n` rows: with more than
/// [`STREAM_MAX_ROWS`] rows, where every chunk of [`crate::CHUNK_ROWS`]
/// weight rows is a pair of groups (a lone last group runs on the 256-bit
/// tiles, which read the rows in order).
pub(crate) fn reads_tiles(m: usize, n: usize) -> bool {
    let last = n % crate::CHUNK_ROWS;
    m > STREAM_MAX_ROWS && (last == 0 || last > G)
}

thread_local! {
    /// A chunk's unpacked blocks (one per block of its rows: 40 KiB for
    /// rows of 2048 values).
    static SCRATCH: RefCell<Vec<Unpacked>> = const { RefCell::new(Vec::new()) };
    /// The second group pair's, for Q3_K's chunks of four groups
    /// ([`tile_span_quad`]); for Q6_K's AMX tiles, the low parts of its
    /// values times their scales ([`super::amx::split6`]).
    static SCRATCH2: RefCell<Vec<Unpacked>> = const { RefCell::new(Vec::new()) };
    /// For Q6_K's AMX tiles, the high parts.
    static SCRATCH3: RefCell<Vec<Unpacked>> = const { RefCell::new(Vec::new()) };
}

/// Weight rows per chunk for Q3_K with the activation rows regrouped by
/// tiles ([`reads_tiles`]), where the matrix's rows divide evenly: two
/// group pairs, whose tiles ([`tile_span_quad`]) feed each broadcast
/// activation word to two `vpdpbusd` instead of one.
const QUAD_ROWS: usize = 4 * G;

/// Weight rows per chunk of an `n`-row matrix in `format` whose activation
/// rows are regrouped by tiles: [`QUAD_ROWS`] for Q3_K where they divide
/// `n` ([`run`] then takes both group pairs at once), else
/// [`crate::CHUNK_ROWS`].
pub(crate) fn tiled_chunk_rows(format: Format, n: usize) -> usize {
    if format == Format::Q3K && n.is_multiple_of(QUAD_ROWS) {
        QUAD_ROWS
    } else {
        crate::CHUNK_ROWS
    }
}

/// The value each integer sum of activation block `ai` starts from
/// ([`crate::act::Bias`]; zero for the unsigned layouts).
///
/// # Safety
/// AVX-512 F; the activation block exists.
#[inline(always)]
unsafe fn starts<W: Group8>(acts: &Acts, ai: usize) -> [__m512i; 2] {
    let bias = &*acts.bias.as_ptr().add(ai);
    match W::SUMS {
        Sums::Span6 => [
            _mm512_set1_epi32(bias.halves32[0]),
            _mm512_set1_epi32(bias.halves32[1]),
        ],
        Sums::All128 => [_mm512_set1_epi32(bias.all128), _mm512_setzero_si512()],
        _ => [_mm512_setzero_si512(); 2],
    }
}

/// The float operations of activation block `ai` times an unpacked block
/// `u`, whose integer sum is `s[0]`, added to `acc` in the 256-bit tile's
/// order (the layouts summed per block; the K-quants' spans go through
/// [`finish_span`] and [`tile_span`]).
///
/// # Safety
/// AVX-512 F; the activation block exists.
#[inline(always)]
pub(crate) unsafe fn finish<W: Group8>(
    u: &Unpacked,
    acts: &Acts,
    ai: usize,
    s: [__m512i; 2],
    acc: __m512,
) -> __m512 {
    let dx = _mm512_set1_ps(*acts.d.get_unchecked(ai));
    let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0]), _mm512_mul_ps(u.d, dx), acc);
    match W::SUMS {
        Sums::Offsets => {
            let sx = _mm512_set1_ps(*acts.s.get_unchecked(ai));
            _mm512_fmadd_ps(u.m, sx, acc)
        }
        Sums::All128 => acc,
        Sums::SpanOffsets => unreachable!("summed per span by `finish_span`"),
        Sums::All127 | Sums::Mins16 | Sums::Span6 => unreachable!("summed per span by `tile_span`"),
    }
}

/// [`Sums::SpanOffsets`]' float operations of activation block `ai` times
/// an unpacked block `u` whose integer sum is `s`: `sp += d s` then `sp +=
/// m X` (the span's sum); at a span's last block (`last`), `acc += sp d_x`
/// and `sp` starts again from zero. One multiply fewer per block than
/// [`finish`]'s `Offsets`, and the span's `d_x` read once.
///
/// # Safety
/// AVX-512 F; the activation block exists.
#[inline(always)]
pub(crate) unsafe fn finish_span(
    u: &Unpacked,
    acts: &Acts,
    ai: usize,
    s: __m512i,
    last: bool,
    sp: &mut __m512,
    acc: &mut __m512,
) {
    *sp = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), u.d, *sp);
    *sp = _mm512_fmadd_ps(u.m, _mm512_set1_ps(*acts.s.get_unchecked(ai)), *sp);
    if last {
        *acc = _mm512_fmadd_ps(*sp, _mm512_set1_ps(*acts.d.get_unchecked(ai)), *acc);
        *sp = _mm512_setzero_ps();
    }
}

/// Whether Q8_0's tiles from scratch (prompt steps) sum their rows as the
/// layouts with offsets do, register by register across the rows, instead
/// of one row's chain of eight `vpdpbusd` after another: on Intel's cores
/// (a Xeon without AMX, alternated with the build before: a layer's
/// products at 512 rows 1.04-1.23x on 1B Q8_0, 1.06-1.30x on 8B; prefill
/// 1.11-1.54x on 1B, 0.95-1.14x on 8B; `benches/README.md`). On an AMD Zen 5
/// the same interleaving lost 5-9% of 1B Q8_0 prefill (its kernel alone
/// gained 1-3%; `benches/HISTORY.md`), so AMD's cores keep the rows apart
/// until measured again. Decode of 5 to 16 sequences (`STREAM`) keeps them
/// apart everywhere: bound by memory, and not measured faster.
fn q8_rows_interleaved() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(crate::is_intel)
}

/// Block `$b` of groups `$g` and `$g + 1` (rows of `$nb` blocks) as
/// `&Unpacked`: with the caller's `STREAM`, unpacked into `$here` from the
/// weights (asked for a pair ahead, [`prefetch_next_pair`]); else
/// `$blocks[$b]`, as unpacked for the chunk. A macro, so that both tiles
/// keep the block in registers.
macro_rules! unpacked {
    ($w:expr, $g:expr, $nb:expr, $blocks:expr, $b:expr, $here:ident) => {
        if STREAM {
            $here = $w.unpack_pair($g * $nb + $b, ($g + 1) * $nb + $b);
            &$here
        } else {
            $blocks.get_unchecked($b)
        }
    };
}

// After `unpacked!`, which its tiles use.
mod span;
use span::{tile_span, tile_span_quad};

/// Every block of groups `g` and `g + 1` unpacked into `out` (cleared
/// first), once for all activation tiles; with `unbiased`, with the bias
/// of [`super::amx::signed`] layouts taken off, for the AMX tiles.
///
/// # Safety
/// As [`Group8::unpack_pair`] for groups `g` and `g + 1`.
#[inline(always)]
unsafe fn unpack2<W: Group8>(w: &W, g: usize, out: &mut Vec<Unpacked>, unbiased: bool) {
    let nb = w.blocks();
    out.clear();
    // A loop, not `extend` over a closure: the closure would be compiled
    // without the caller's AVX-512 and not inlined.
    for b in 0..nb {
        let mut u = w.unpack_pair(g * nb + b, (g + 1) * nb + b);
        if unbiased {
            super::amx::unbias::<W>(std::slice::from_mut(&mut u));
        }
        out.push(u);
    }
}

/// Blocks `blocks` (one group pair's, in order) of a `W` times activation
/// rows `a..a + A`: lanes 0..8 of `[j]` are [`Group8::tile`]'s lanes for
/// the first group, lanes 8..16 those for the second, with the same integer
/// sums and float operations in the same order (so the same bits).
///
/// # Safety
/// AVX-512 F/VNNI; groups `g` and `g + 1` exist; the activation rows exist
/// and have as many blocks as the weight rows (`blocks.len()`, unless
/// `STREAM`, where `blocks` is not read and each block is unpacked from
/// `w`).
#[inline(always)]
unsafe fn tile_unpacked<W: Group8, const A: usize, const STREAM: bool, const TILED: bool>(
    w: &W,
    g: usize,
    blocks: &[Unpacked],
    acts: &Acts,
    a: usize,
) -> [__m512; A] {
    if W::SUMS.per_span() {
        return tile_span::<W, A, STREAM, TILED>(w, g, blocks, acts, a);
    }
    let nb = acts.nb;
    // Where row `a + j`'s block `b` is: with `TILED`, the rows regrouped by
    // tiles ([`Acts::quantize_tiled`]), else row by row.
    macro_rules! ix {
        ($j:expr, $b:expr) => {
            if TILED {
                tiled_at(nb, a, A, $j, $b)
            } else {
                (a + $j) * nb + $b
            }
        };
    }
    assert!((STREAM || blocks.len() == nb) && (a + A) * nb <= acts.qs.len());
    let kspan = W::SUMS == Sums::SpanOffsets;
    assert!(!kspan || (acts.span == 256 && nb.is_multiple_of(SPAN_BLOCKS)));
    let q8_rows = W::SUMS == Sums::All128 && !STREAM && q8_rows_interleaved();
    let mut acc = [_mm512_setzero_ps(); A];
    // With `SpanOffsets`, each row's span sum.
    let mut sp = [_mm512_setzero_ps(); A];
    for b in 0..nb {
        if a == 0 {
            prefetch_next_pair(w, g, b);
        }
        let here;
        let u = unpacked!(w, g, nb, blocks, b, here);
        // Unrolled, so that the sums and accumulators stay in registers (a
        // loop over `j` was kept as a loop, with them on the stack). A
        // macro, not a closure: a closure would be compiled without the
        // caller's AVX-512.
        macro_rules! rows {
            ($j:ident; $body:block) => {
                rows!(@ $j; $body; 0 1 2 3 4 5 6 7)
            };
            (@ $j:ident; $body:block; $($n:literal)*) => {$(
                if $n < A {
                    let $j: usize = $n;
                    $body
                }
            )*};
        }
        // Row `j`'s sums of value registers `vs`, into `s[h]`.
        macro_rules! dots {
            ($j:ident, $s:expr, $vs:expr, $h:expr) => {
                let x = acts.qs.as_ptr().add(ix!($j, b)) as *const i32;
                for v in $vs {
                    let xv = _mm512_set1_epi32(x.add(v).read());
                    $s[$h] = _mm512_dpbusd_epi32($s[$h], u.w[v], xv);
                }
            };
        }
        if W::SUMS == Sums::Offsets || kspan || q8_rows {
            // Every row's sum first, register by register across the rows,
            // then their float operations: one row's chain of eight
            // `vpdpbusd` after another left the core waiting on each chain
            // (Q4_K prefill 8-13% slower so). Q8_0 so too in prompt steps
            // on Intel's cores ([`q8_rows_interleaved`]), else row by row.
            let mut s = [[_mm512_setzero_si512(); 2]; A];
            rows!(j; { s[j] = starts::<W>(acts, ix!(j, b)) });
            for v in 0..G / 2 {
                rows!(j; { dots!(j, s[j], v..v + 1, 0); });
            }
            for v in G / 2..G {
                rows!(j; { dots!(j, s[j], v..v + 1, 0); });
            }
            if kspan {
                let last = b % SPAN_BLOCKS == SPAN_BLOCKS - 1;
                rows!(j; { finish_span(u, acts, ix!(j, b), s[j][0], last, &mut sp[j], &mut acc[j]) });
            } else {
                rows!(j; { acc[j] = finish::<W>(u, acts, ix!(j, b), s[j], acc[j]) });
            }
        } else {
            rows!(j; {
                let ai = ix!(j, b);
                let mut s = starts::<W>(acts, ai);
                dots!(j, s, 0..G, 0);
                acc[j] = finish::<W>(u, acts, ai, s, acc[j]);
            });
        }
    }
    if !matches!(W::SUMS, Sums::Offsets | Sums::SpanOffsets) {
        // The 256-bit signed tiles add their (zero) offsets' sums last.
        // A loop: `map`'s closure is compiled without AVX-512, so the add
        // became a call per register.
        for acc in &mut acc {
            *acc = _mm512_add_ps(*acc, _mm512_setzero_ps());
        }
    }
    acc
}

/// Stores a tile of groups `g` and `g + 1` (lanes as [`tile_unpacked`]).
///
/// # Safety
/// As [`put_group`] for both groups' columns.
#[inline(always)]
unsafe fn put_pair<const A: usize>(rows: usize, g: usize, a: usize, v: [__m512; A], out: Out) {
    let r = G * g;
    if r + 2 * G <= rows {
        // Both groups whole: each activation row's sixteen columns at once.
        for (j, v) in v.iter().enumerate() {
            // SAFETY: `row` checks the bounds; the columns are the caller's.
            _mm512_storeu_ps(out.row(r, a + j, 2 * G), *v);
        }
        return;
    }
    let mut lanes = [[0f32; 2 * G]; A];
    for (l, v) in lanes.iter_mut().zip(v) {
        _mm512_storeu_ps(l.as_mut_ptr(), v);
    }
    for h in 0..2 {
        let t: [[f32; A]; G] =
            std::array::from_fn(|l| std::array::from_fn(|j| lanes[j][G * h + l]));
        put_group(rows, g + h, a, t, out);
    }
}

/// Groups `groups` times every activation row: pairs of groups on 512-bit
/// registers, a lone last group on the 256-bit tiles.
///
/// With `AMX` (and a layout the AMX tiles take, [`super::amx::supports`]),
/// each unpacked pair runs 16 activation rows at a time on AMX tiles
/// ([`super::amx::tile`]), the rows left over on the 512-bit tiles.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI, and [`super::amx::available`]
/// with `AMX`; as [`super::run_scalar`] for `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
pub(crate) unsafe fn run<W: Group8, const AMX: bool>(
    w: &W,
    acts: &Acts,
    groups: Range<usize>,
    out: Out,
) {
    let m = acts.rows();
    let rows = w.rows();
    let mut g = groups.start;
    // One activation tile or a few: each block unpacked where it is used.
    let stream = m <= STREAM_MAX_ROWS;
    // The rows regrouped by tiles, as `reads_tiles` says.
    let tiled = acts.tiled;
    assert!(!tiled || (!stream && groups.len().is_multiple_of(2)));
    if tiled && !AMX && W::SUMS == Sums::All127 && groups.len() == 4 {
        // Both pairs exist (`unpack_pair`'s condition, either way).
        assert!(g + 4 <= rows.div_ceil(G));
        SCRATCH.with_borrow_mut(|b0| {
            SCRATCH2.with_borrow_mut(|b1| {
                unpack2(w, g, b0, false);
                unpack2(w, g + 2, b1, false);
                let mut a = 0;
                while a < m {
                    let at = tile_rows(m - a, 8);
                    macro_rules! quad {
                        ($a:literal) => {{
                            let [v0, v1] = tile_span_quad::<W, $a>(w, g, b0, b1, acts, a);
                            put_pair(rows, g, a, v0, out);
                            put_pair(rows, g + 2, a, v1, out);
                        }};
                    }
                    match at {
                        8 => quad!(8),
                        4 => quad!(4),
                        2 => quad!(2),
                        _ => quad!(1),
                    }
                    a += at;
                }
            })
        });
        return;
    }
    // AMX tiles for whole tiles of 16 rows (more than `STREAM_MAX_ROWS`:
    // the blocks are unpacked into scratch).
    let amx = AMX
        && !stream
        && (!tiled || acts.tiles16)
        && super::amx::supports(W::SUMS)
        && g + 1 < groups.end;
    assert!(
        !acts.tiles16 || amx || g + 1 >= groups.end,
        "tiles of 16 rows for AMX only"
    );
    if amx {
        super::amx::configure::<W>();
    }
    // Q6_K's AMX tiles read its values times their scales, split in two
    // bytes ([`super::amx::split6`]), beside the blocks as unpacked.
    let split = amx && m >= super::amx::ROWS && W::SUMS == Sums::Span6;
    SCRATCH.with_borrow_mut(|scratch| {
        SCRATCH2.with_borrow_mut(|lo| {
            SCRATCH3.with_borrow_mut(|hi| {
                while g + 1 < groups.end {
                    // Both groups exist (`unpack_pair`'s condition, either way).
                    assert!(g + 2 <= rows.div_ceil(G));
                    // The AMX tiles take Q8_0's values signed where the 512-bit
                    // tiles take them biased: the bias comes off for the AMX tiles
                    // and back on for rows left to the 512-bit tiles.
                    let unbiased = amx && m >= super::amx::ROWS && super::amx::signed::<W>();
                    if !stream {
                        unpack2(w, g, scratch, unbiased);
                    }
                    if split {
                        super::amx::split6(scratch, lo, hi);
                    }
                    let mut a = 0;
                    while amx && a + super::amx::ROWS <= m {
                        let (b, h): (&[Unpacked], &[Unpacked]) =
                            if split { (lo, hi) } else { (scratch, &[]) };
                        let v = if tiled {
                            super::amx::tile::<W, true>(b, h, acts, a)
                        } else {
                            super::amx::tile::<W, false>(b, h, acts, a)
                        };
                        put_pair(rows, g, a, v, out);
                        a += super::amx::ROWS;
                    }
                    if unbiased && a < m {
                        super::amx::unbias::<W>(scratch);
                    }
                    while a < m {
                        // Unpacking each block per tile, any 1 to 8 rows are one
                        // tile (5 as 4 and 1 cost a second unpacking and pass:
                        // decode of 5 and 7 sequences 1.08-1.46x faster so).
                        let at = if stream {
                            (m - a).min(8)
                        } else {
                            tile_rows(m - a, 8)
                        };
                        macro_rules! pair {
                            ($a:literal) => {{
                                let v = match (stream, tiled) {
                                    (true, _) => {
                                        tile_unpacked::<W, $a, true, false>(w, g, &[], acts, a)
                                    }
                                    (false, true) => {
                                        tile_unpacked::<W, $a, false, true>(w, g, scratch, acts, a)
                                    }
                                    (false, false) => {
                                        tile_unpacked::<W, $a, false, false>(w, g, scratch, acts, a)
                                    }
                                };
                                put_pair(rows, g, a, v, out)
                            }};
                        }
                        // Sizes only `stream` picks.
                        macro_rules! streamed {
                            ($a:literal) => {
                                put_pair(
                                    rows,
                                    g,
                                    a,
                                    tile_unpacked::<W, $a, true, false>(w, g, &[], acts, a),
                                    out,
                                )
                            };
                        }
                        match at {
                            8 => pair!(8),
                            7 => streamed!(7),
                            6 => streamed!(6),
                            5 => streamed!(5),
                            4 => pair!(4),
                            3 => streamed!(3),
                            2 => pair!(2),
                            _ => pair!(1),
                        }
                        a += at;
                    }
                    g += 2;
                }
            })
        })
    });
    if amx {
        super::amx::release();
    }
    if g < groups.end {
        let mut a = 0;
        while a < m {
            let at = tile_rows(m - a, 8);
            match at {
                8 => put_tile::<W, 8, VNNI_512, false>(w, acts, g, a, out),
                4 => put_tile::<W, 4, VNNI_512, false>(w, acts, g, a, out),
                2 => put_tile::<W, 2, VNNI_512, false>(w, acts, g, a, out),
                _ => put_tile::<W, 1, VNNI_512, false>(w, acts, g, a, out),
            }
            a += at;
        }
    }
}
