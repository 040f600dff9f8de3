//! AMX-BF16 tiles (Intel Xeon from Sapphire Rapids on) for
//! [`super::Bf16Matrix`]: `tdpbf16ps` adds 16 x 16 x 32 bf16 products per
//! instruction, where `vdpbf16ps` adds 16 x 2.
//!
//! The packed weights are already `B` tiles: a panel keeps, for each input
//! pair, its 64 columns' two weights side by side (256 bytes), so 16
//! consecutive pairs of 16 columns are 16 rows of 64 bytes, 256 bytes
//! apart. The `A` tile is 16 rows of the rounded activations, 16 pairs
//! each (a row's pairs are contiguous, rows `kp` pairs apart). Per tile of
//! 16 rows x 64 columns, four `C` tiles (`tmm0..tmm3`) sum over the input
//! in steps of 32; the sums are then added to the destination, as the
//! 512-bit kernel adds its accumulators. A tile of fewer rows (the last of
//! a call) is configured with that many, so a row's sums never depend on
//! the other rows of the call.
//!
//! The products of bf16 values are exact; the tile unit adds them in its
//! own order, so results differ from the 512-bit kernel's in the last bits
//! of the f32 sums (both are checked against f64 sums in the tests, and
//! against each other once per process before the tiles are used).

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::{SendPtr, NR};
use crate::x8::amx::{release, Config};

/// Activation rows per tile.
const ROWS: usize = 16;
/// Input pairs per step (one `A` tile row is 64 bytes).
pub(super) const PAIRS: usize = 16;

/// Whether this CPU has AMX-BF16, the kernel lets this process use the
/// tiles, `HEARTH_KERNELS_AMX` is not `0`, and a first product agreed
/// with the 512-bit kernel (asked once).
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if crate::set_to_zero("HEARTH_KERNELS_AMX") {
            return false;
        }
        if !granted() {
            return false;
        }
        let ok = crate::isolated(self_check).unwrap_or(false);
        if !ok {
            eprintln!("hearth-kernels: AMX-BF16 tiles disagree with AVX-512 BF16; not used");
        }
        ok
    })
}

/// Whether this CPU has AMX-BF16 (and AVX-512 BF16, for the activations'
/// rounding) and the kernel lets this process use the tiles.
pub(super) fn granted() -> bool {
    // CPUID leaf 7: AMX-BF16 is bit 22 of EDX.
    let bf16 = (__cpuid_count(7, 0).edx >> 22) & 1 == 1;
    bf16 && crate::x8::amx::available() && super::Bf16Matrix::is_supported()
}

/// The tiles against the 512-bit kernel on one product with a short last
/// tile of rows and of columns.
fn self_check() -> bool {
    let (m, n, k) = (21, 70, 64);
    let value = |i: usize| ((i * 7919) % 263) as f32 / 131.0 - 1.0;
    let w: Vec<f32> = (0..n * k).map(value).collect();
    let x: Vec<f32> = (0..m * k).map(|i| value(i + 5)).collect();
    let Ok(mat) = super::Bf16Matrix::new(&w, n, k) else {
        return false;
    };
    let (mut tiles, mut wide) = (vec![0f32; m * n], vec![0f32; m * n]);
    mat.run_with(true, &mut Vec::new(), &x, m, &mut tiles);
    mat.run_with(false, &mut Vec::new(), &x, m, &mut wide);
    tiles.iter().zip(&wide).all(|(a, b)| (a - b).abs() <= 1e-4)
}

/// 16 rows of 64 sums, as the four `C` tiles store them side by side.
#[repr(C, align(64))]
struct Sums([[f32; NR]; ROWS]);

/// `dst[rows, cols] += a[rows] . panel` in tiles of 16 rows, `kp` a
/// multiple of [`PAIRS`].
///
/// # Safety
/// [`available`]; `a` holds the rows (`kp` pairs each), `panel` `kp * NR`
/// pairs; nobody else writes `dst[rows, cols]` meanwhile.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn block(
    a: &[u32],
    kp: usize,
    panel: &[u32],
    dst: SendPtr,
    ldd: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    assert!(kp.is_multiple_of(PAIRS) && rows.end * kp <= a.len() && panel.len() == kp * NR);
    assert!(cols.len() <= NR && cols.start + cols.len() <= ldd);
    let masks = super::avx512::column_masks(cols.len());
    let mut sums = Sums([[0f32; NR]; ROWS]);
    let (a_stride, b_stride) = (kp * 4, NR * 4);
    let mut r = rows.start;
    let mut configured = 0;
    while r < rows.end {
        let h = (rows.end - r).min(ROWS);
        // `tmm0..tmm3`: sums (h rows of 16 f32); `tmm4`: activations (h
        // rows of 16 pairs); `tmm5`, `tmm6`: weights (16 pairs of 16
        // columns), loaded in turn.
        // Configured once per call, again only for a short last tile.
        if h != configured {
            let c = (64, h as u8);
            Config::of(&[c, c, c, c, c, (64, 16), (64, 16)]).load();
            configured = h;
        }
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for q in (0..kp).step_by(PAIRS) {
            let b = panel.as_ptr().add(q * NR);
            asm!(
                "tileloadd tmm4, [{a} + {sa}*1]",
                "tileloadd tmm5, [{b0} + {sb}*1]",
                "tileloadd tmm6, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tileloadd tmm5, [{b2} + {sb}*1]",
                "tdpbf16ps tmm1, tmm4, tmm6",
                "tileloadd tmm6, [{b3} + {sb}*1]",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tdpbf16ps tmm3, tmm4, tmm6",
                a = in(reg) a.as_ptr().add(r * kp + q),
                b0 = in(reg) b,
                b1 = in(reg) b.add(16),
                b2 = in(reg) b.add(32),
                b3 = in(reg) b.add(48),
                sa = in(reg) a_stride,
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        let s = sums.0.as_mut_ptr().cast::<f32>();
        asm!(
            "tilestored [{s0} + {st}*1], tmm0",
            "tilestored [{s1} + {st}*1], tmm1",
            "tilestored [{s2} + {st}*1], tmm2",
            "tilestored [{s3} + {st}*1], tmm3",
            s0 = in(reg) s,
            s1 = in(reg) s.add(16),
            s2 = in(reg) s.add(32),
            s3 = in(reg) s.add(48),
            st = in(reg) NR * 4,
            options(nostack),
        );
        for (i, row) in sums.0.iter().enumerate().take(h) {
            let d = dst.0.add((r + i) * ldd + cols.start);
            for (t, &mask) in masks.iter().enumerate() {
                let at = d.add(16 * t);
                let add = _mm512_load_ps(row.as_ptr().add(16 * t));
                let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), add);
                _mm512_mask_storeu_ps(at, mask, sum);
            }
        }
        r += h;
    }
    release();
}
