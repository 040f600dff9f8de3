//! Q2_K, Q3_K, Q4_K, Q5_K and Q6_K unpacked into the interleaved layouts of
//! the 32-value formats (`x8/`).
//!
//! A K-quant super-block of 256 values is eight blocks of 32 here, each with
//! its own integer sub-block scales under the super-block's f16 scales
//! (`x8/scales.rs`), so the same kernels run them:
//!
//! - Q4_K: `w = d sc_s q - dmin mn_s` (`q` 4-bit, `sc`, `mn` 6-bit per 32
//!   values): a 4-bit block with factor `d sc_s` and offset `-dmin mn_s`;
//! - Q5_K: the same with 5-bit `q`: a 5-bit block (nibbles and fifth
//!   bits) with Q4_K's factor and offset;
//! - Q6_K: `w = d sc_g (q - 32)` (`q` 6-bit, `sc` signed 8-bit per 16
//!   values): a signed block of `q - 32` (stored as packed 6-bit `q`) with
//!   one factor per half;
//! - Q3_K: `w = d (sc_g - 32) q` (`q` in -4..4 from two low bits and a high
//!   bit, `sc` 6-bit per 16 values): packed 3-bit values, which the kernels
//!   multiply by their (small, integer) 16-value scales, `p = (sc - 32) q`
//!   in -124..=128, before summing; one factor `d` per block;
//! - Q2_K: `w = d sc_g q - dmin mn_g` (`q` 2-bit, `sc`, `mn` 4-bit per 16
//!   values): a layout of its own (`x8/k2.rs`), whose kernels sum the
//!   values times their scales and the mins times the activations' half
//!   sums in integers, under the factors `d` and `-dmin`.
//!
//! The activations are quantized per 32 values like those of every other
//! format (llama.cpp quantizes them per 256 for the K-quants; per 32 is
//! the finer of the two). Stored sizes per 256 values and row: Q2_K 84
//! bytes (the GGUF block: 84), Q3_K 114 (110), Q4_K 148 (144), Q5_K 180
//! (176) and Q6_K 210 (210).

use crate::formats::{h, pack_nibbles, Q8, QK};
use crate::x8::i8::{I3x8, I6x8};
use crate::x8::k2::K2x8;
use crate::x8::scales::{Super16, SuperK3, SuperK4, SuperK6};
use crate::x8::u4::Ux8;
use crate::x8::{half_lanes, lanes, G};
use crate::Error;

/// Values per super-block.
pub(crate) const QKK: usize = 256;
const _: () = assert!(QKK == G * QK);

/// The 6-bit scale and min of sub-block `j` of a Q4_K super-block from its
/// 12 packed bytes: sub-blocks 0..4 keep theirs in the low 6 bits of bytes
/// `j` and `j + 4`; sub-blocks 4..8 have their low 4 bits in the nibbles of
/// byte `j + 4` and their top 2 bits in the spare top bits of bytes `j - 4`
/// (scale) and `j` (min).
fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K's and Q5_K's super-block scales: `d`, `dmin` (f16) at bytes 0..4,
/// then 12 bytes of packed 6-bit scales and mins, appended per row-block.
struct K4Scales {
    d: Vec<f32>,
    dmin: Vec<f32>,
    sc: Vec<u8>,
    mn: Vec<u8>,
}

impl K4Scales {
    fn with_capacity(superblocks: usize) -> Self {
        Self {
            d: Vec::with_capacity(superblocks),
            dmin: Vec::with_capacity(superblocks),
            sc: Vec::with_capacity(superblocks * G),
            mn: Vec::with_capacity(superblocks * G),
        }
    }

    fn push(&mut self, b: &[u8]) {
        self.d.push(h(b, 0));
        self.dmin.push(h(b, 2));
        for j in 0..G {
            let (s, m) = q4k_scale_min(&b[4..16], j);
            self.sc.push(s);
            self.mn.push(m);
        }
    }

    /// Interleaved for `n` rows of `k` values.
    fn lanes(&self, n: usize, k: usize) -> Result<SuperK4, Error> {
        Ok(SuperK4 {
            d: half_lanes(&self.d, n, k / QKK)?,
            dmin: half_lanes(&self.dmin, n, k / QKK)?,
            sc: lanes(&self.sc, n, k / QK),
            mn: lanes(&self.mn, n, k / QK),
        })
    }
}

/// `n` rows of Q4_K super-blocks (`blocks`: 144 bytes each, row major),
/// or with `FIVE` of Q5_K ones (176 bytes: the same with 32 bytes of fifth
/// bits before the nibbles).
pub(crate) fn unpack_q45k<'a, const FIVE: bool>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    n: usize,
    k: usize,
) -> Result<Ux8<SuperK4, FIVE>, Error> {
    let total = blocks.len();
    let mut qs = Vec::with_capacity(total * G);
    let mut high = Vec::with_capacity(if FIVE { total * G } else { 0 });
    let mut scales = K4Scales::with_capacity(total);
    let nibbles = if FIVE { 48 } else { 16 };
    for b in blocks {
        scales.push(b);
        // Per 64 values (chunk c): low nibbles are the first 32, high the
        // next. Q5_K's qh[32]: bit 2c (2c + 1) of byte l is the fifth bit
        // of value l of the low (high) nibbles of chunk c.
        let (qh, q) = (&b[16..48], &b[nibbles..nibbles + 128]);
        for c in 0..4 {
            let q = &q[32 * c..32 * c + 32];
            for (half, shift) in [0, 4].into_iter().enumerate() {
                qs.push(pack_nibbles(&std::array::from_fn(|l| {
                    (q[l] >> shift) & 0xF
                })));
                if FIVE {
                    let bit = 2 * c + half;
                    high.push((0..32).map(|l| (((qh[l] >> bit) & 1) as u32) << l).sum());
                }
            }
        }
    }
    let high = FIVE.then_some(high.as_slice());
    Ok(Ux8::new(&qs, high, n, k / QK, scales.lanes(n, k)?))
}

/// The 6-bit scale of sub-block `s` (16 values) of a Q3_K super-block from
/// its 12 packed bytes: the low four bits in the nibbles of bytes 0..8
/// (sub-blocks 0..8 in the low nibbles, 8..16 in the high), the top two in
/// bits `2 (s / 4)` of byte `8 + s % 4`.
fn q3k_scale(s: &[u8], i: usize) -> u8 {
    let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
    low | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)
}

/// `n` rows of Q3_K super-blocks (`blocks`: 110 bytes each, row major).
pub(crate) fn unpack_q3k<'a>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    n: usize,
    k: usize,
) -> Result<I3x8<SuperK3>, Error> {
    let (nb, ns, total) = (k / QK, k / QKK, blocks.len());
    let mut qs = Vec::with_capacity(total * G);
    let mut sc = Vec::with_capacity(total * G);
    let mut d = Vec::with_capacity(total);
    for b in blocks {
        // hmask[32] high bits, qs[64] low two bits, 12 bytes of scales, d.
        let (hmask, low, scales) = (&b[0..32], &b[32..96], &b[96..108]);
        d.push(h(b, 108));
        // Value `128 half + 32 j + t`: bits `2 j..2 j + 2` of byte `32 half
        // + t` of `low`, high bit `4 half + j` of `hmask[t]` (set: +0,
        // clear: -4), scale `8 half + 2 j + t / 16`.
        for s in 0..G {
            let (half, j) = (s / 4, s % 4);
            qs.push(Q8(std::array::from_fn(|t| {
                let q = (low[32 * half + t] >> (2 * j)) & 3;
                let high = (hmask[t] >> (4 * half + j)) & 1;
                q as i8 - if high == 1 { 0 } else { 4 }
            })));
            sc.push([0, 1].map(|i| q3k_scale(scales, 2 * s + i) as i8 - 32));
        }
    }
    Ok(I3x8::new(&qs, n, nb, super16(&d, &sc, n, nb, ns)?))
}

/// `n` rows of Q2_K super-blocks (`blocks`: 84 bytes each, row major).
pub(crate) fn unpack_q2k<'a>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    n: usize,
    k: usize,
) -> Result<K2x8, Error> {
    let (nb, ns, total) = (k / QK, k / QKK, blocks.len());
    let mut qs = Vec::with_capacity(total * G);
    let mut sm = Vec::with_capacity(total * G);
    let (mut d, mut dmin) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for b in blocks {
        // 16 bytes `sc | mn << 4` (one per 16 values), qs[64] two bits per
        // value, d, dmin.
        let (scales, low) = (&b[0..16], &b[16..80]);
        d.push(h(b, 80));
        dmin.push(h(b, 82));
        // Value `128 half + 32 j + t`: bits `2 j..2 j + 2` of byte `32 half
        // + t`, as Q3_K's low bits; scale and min `8 half + 2 j + t / 16`.
        for s in 0..G {
            let (half, j) = (s / 4, s % 4);
            qs.push(Q8(std::array::from_fn(|t| {
                ((low[32 * half + t] >> (2 * j)) & 3) as i8
            })));
            sm.push([scales[2 * s], scales[2 * s + 1]]);
        }
    }
    Ok(K2x8::new(
        &qs,
        &sm,
        n,
        nb,
        half_lanes(&d, n, ns)?,
        half_lanes(&dmin, n, ns)?,
    ))
}

/// Q6_K's and Q3_K's scales (`d` per super-block, two signed scales per
/// block) of `n` rows of `nb` blocks (`ns` super-blocks), interleaved.
fn super16<const INTEGER: bool>(
    d: &[f32],
    sc: &[[i8; 2]],
    n: usize,
    nb: usize,
    ns: usize,
) -> Result<Super16<INTEGER>, Error> {
    Ok(Super16 {
        d: half_lanes(d, n, ns)?,
        sc: lanes(sc, n, nb)
            .iter()
            .map(|l| [l.map(|s| s[0]), l.map(|s| s[1])])
            .collect(),
    })
}

/// `n` rows of Q6_K super-blocks (`blocks`: 210 bytes each, row major).
pub(crate) fn unpack_q6k<'a>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    n: usize,
    k: usize,
) -> Result<I6x8<SuperK6>, Error> {
    let (nb, ns, total) = (k / QK, k / QKK, blocks.len());
    let mut qs = Vec::with_capacity(total * G);
    let mut sc = Vec::with_capacity(total * G);
    let mut d = Vec::with_capacity(total);
    for b in blocks {
        // ql[128] low 4 bits, qh[64] high 2 bits, 16 i8 scales, d.
        let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
        d.push(h(b, 208));
        let mut v = [0i8; QKK];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            let v = &mut v[128 * half..];
            for l in 0..32 {
                let hb = |s: u32| (qh[l] >> s) & 3;
                let q = |low: u8, s| ((low | (hb(s) << 4)) as i32 - 32) as i8;
                v[l] = q(ql[l] & 0xF, 0);
                v[l + 32] = q(ql[l + 32] & 0xF, 2);
                v[l + 64] = q(ql[l] >> 4, 4);
                v[l + 96] = q(ql[l + 32] >> 4, 6);
            }
        }
        for s in 0..G {
            qs.push(Q8(v[QK * s..QK * (s + 1)].try_into().expect("32 values")));
            sc.push([scales[2 * s] as i8, scales[2 * s + 1] as i8]);
        }
    }
    Ok(I6x8::new(&qs, n, nb, super16(&d, &sc, n, nb, ns)?))
}
