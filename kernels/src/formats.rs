//! GGUF block formats and their unpacking into the two layouts the kernels
//! work on.
//!
//! The K-quants are unpacked by `kquants.rs`'s layouts. Every other format
//! is cut into 32-value blocks, each read as one of the following, then
//! stored with eight rows interleaved (`x8/`):
//!
//! - [`U4`]: 32 unsigned 4-bit values `q` in 16 bytes (byte `j` holds value
//!   `j` in its low nibble and value `j + 16` in its high nibble, the
//!   Q4_0/Q4_1 order), a scale `d` and an offset `m`, so that `w = d q + m`.
//!   Q4_0 (`d (q - 8)`, so `m = -8 d`) and Q4_1 (`d q + m`) fit.
//! - [`I8`]: 32 signed bytes `q`, a scale `d` and optionally an offset `m`
//!   per block: `w = d q (+ m)`.
//!   Q8_0 (`d q`), Q5_0 (`d (q - 16)`) and Q5_1 (`d q + m`, `q` in 0..32)
//!   fit.
//!
//! Every weight is reproduced exactly, in as many bytes as the GGUF blocks
//! (scales and offsets stay f16; Q4_0's offset `-8 d` is one too), plus the
//! padding of the last group of eight rows.

use std::ops::Range;

use half::f16;

use crate::kquants::{K4, K6};
use crate::x8::{i8::I8x8, u4::U4x8, Group8};
use crate::Error;

/// A GGUF (GGML) block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q6K,
}

impl Format {
    /// All formats, for tests and tools.
    pub const ALL: [Format; 7] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
    ];

    /// Values per block (the row length must be a multiple of it).
    pub fn block_values(self) -> usize {
        match self {
            Format::Q4K | Format::Q6K => 256,
            _ => 32,
        }
    }

    /// Bytes per block in the GGUF file.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 => 34,
            Format::Q4K => 144,
            Format::Q6K => 210,
        }
    }
}

/// Values per kernel block.
pub(crate) const QK: usize = 32;

/// 32 4-bit values (see [`U4`]).
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Nib(pub [u8; 16]);

/// 32 8-bit values (weights or quantized activations).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8(pub [i8; QK]);

/// Blocks `w = d q + m` with 4-bit `q`; block `b` of row `r` at `r * nb + b`.
#[derive(Debug)]
pub(crate) struct U4 {
    pub nb: usize,
    pub qs: Vec<Nib>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
}

/// Blocks `w_j = d q_j (+ m)` with 8-bit `q`, laid out as [`U4`].
#[derive(Debug)]
pub(crate) struct I8 {
    pub nb: usize,
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    pub m: Option<Vec<f32>>,
}

#[derive(Debug)]
pub(crate) enum Repr {
    U4x8(U4x8),
    I8x8(I8x8),
    K4(K4),
    K6(K6),
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Packs 32 values below 16 in the [`U4`] nibble order.
fn pack_nibbles(v: &[u8; QK]) -> Nib {
    let mut n = Nib::default();
    for j in 0..16 {
        n.0[j] = (v[j] & 0xF) | (v[j + 16] << 4);
    }
    n
}

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

/// Unpacks `n` rows of `k` values of `format` from GGUF block bytes.
pub(crate) fn unpack(format: Format, data: &[u8], n: usize, k: usize) -> Result<Repr, Error> {
    let bv = format.block_values();
    if k == 0 || !k.is_multiple_of(bv) {
        return Err(Error(format!(
            "{format:?} row length {k} is not a positive multiple of {bv}"
        )));
    }
    let blocks = n * k / bv;
    if data.len() != blocks * format.block_bytes() {
        return Err(Error(format!(
            "{format:?} [{n}, {k}] needs {} bytes, got {}",
            blocks * format.block_bytes(),
            data.len()
        )));
    }
    let nb = k / QK;
    let total = n * nb;
    let chunks = data.chunks_exact(format.block_bytes());
    Ok(match format {
        Format::Q4K => {
            let ns = k / 256;
            let mut w = K4 {
                ns,
                qs: Vec::with_capacity(total),
                sc: Vec::with_capacity(blocks),
                mn: Vec::with_capacity(blocks),
                d: Vec::with_capacity(blocks),
                dmin: Vec::with_capacity(blocks),
            };
            for b in chunks {
                w.d.push(h(b, 0));
                w.dmin.push(h(b, 2));
                let (scales, qs) = (&b[4..16], &b[16..144]);
                let (mut sc, mut mn) = ([0i16; 8], [0i32; 8]);
                for j in 0..8 {
                    let (s, m) = q4k_scale_min(scales, j);
                    (sc[j], mn[j]) = (s as i16, m as i32);
                }
                w.sc.push(sc);
                w.mn.push(mn);
                // Per 64 values: low nibbles are the first 32, high the next.
                for c in 0..4 {
                    let q = &qs[32 * c..32 * c + 32];
                    for shift in [0, 4] {
                        let v: [u8; QK] = std::array::from_fn(|l| (q[l] >> shift) & 0xF);
                        w.qs.push(pack_nibbles(&v));
                    }
                }
            }
            Repr::K4(w)
        }
        Format::Q6K => {
            let mut w = K6 {
                ns: k / 256,
                qs: Vec::with_capacity(total),
                sc: Vec::with_capacity(blocks),
                d: Vec::with_capacity(blocks),
            };
            for b in chunks {
                // ql[128] low 4 bits, qh[64] high 2 bits, 16 i8 scales, d.
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                w.d.push(h(b, 208));
                w.sc.push(std::array::from_fn(|g| sc[g] as i8 as i16));
                let mut v = [0i8; 256];
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
                for s in 0..8 {
                    w.qs.push(Q8(v[32 * s..32 * s + 32].try_into().expect("32")));
                }
            }
            Repr::K6(w)
        }
        Format::Q4_0 | Format::Q4_1 => {
            let mut u = U4 {
                nb,
                qs: Vec::with_capacity(total),
                d: Vec::with_capacity(total),
                m: Vec::with_capacity(total),
            };
            for b in chunks {
                match format {
                    Format::Q4_0 => {
                        let d = h(b, 0);
                        u.d.push(d);
                        u.m.push(-8.0 * d);
                        u.qs.push(Nib(b[2..18].try_into().expect("16 bytes")));
                    }
                    Format::Q4_1 => {
                        u.d.push(h(b, 0));
                        u.m.push(h(b, 2));
                        u.qs.push(Nib(b[4..20].try_into().expect("16 bytes")));
                    }
                    _ => unreachable!("only Q4_0 and Q4_1 here"),
                }
            }
            Repr::U4x8(U4x8::new(&u, n)?)
        }
        Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
            let has_m = format == Format::Q5_1;
            let mut w = I8 {
                nb,
                qs: Vec::with_capacity(total),
                d: Vec::with_capacity(total),
                m: has_m.then(|| Vec::with_capacity(total)),
            };
            for b in chunks {
                match format {
                    Format::Q8_0 => {
                        w.d.push(h(b, 0));
                        w.qs.push(Q8(std::array::from_fn(|j| b[2 + j] as i8)));
                    }
                    Format::Q5_0 | Format::Q5_1 => {
                        // d, (m), 4 bytes of fifth bits (bit j for value j), nibbles.
                        let o = if has_m { 4 } else { 2 };
                        let d = h(b, 0);
                        let qh = u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
                        let qs = &b[o + 4..o + 20];
                        let bias = if has_m { 0 } else { 16 };
                        let q = std::array::from_fn(|j| {
                            let low = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
                            let high = ((qh >> j) & 1) as u8;
                            ((low | (high << 4)) as i32 - bias) as i8
                        });
                        w.d.push(d);
                        w.qs.push(Q8(q));
                        if let Some(m) = w.m.as_mut() {
                            m.push(h(b, 2));
                        }
                    }
                    _ => unreachable!("only Q5_0, Q5_1 and Q8_0 here"),
                }
            }
            Repr::I8x8(I8x8::new(&w, n)?)
        }
    })
}

impl Repr {
    /// Appends rows `rows` as f32, row major.
    pub(crate) fn dequantize_rows(&self, rows: Range<usize>, out: &mut Vec<f32>) {
        match self {
            Repr::U4x8(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::I8x8(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::K4(w) => w.dequantize_rows(rows, out),
            Repr::K6(w) => w.dequantize_rows(rows, out),
        }
    }
}

/// Quantizes `w` (length a multiple of 32) to GGUF Q8_0 blocks: per 32
/// values `d = max|w| / 127` stored as f16 and `q = round(w / d)`.
pub fn quantize_q8_0(w: &[f32]) -> Vec<u8> {
    assert!(
        w.len().is_multiple_of(QK),
        "Q8_0 needs a multiple of 32 values"
    );
    let mut out = Vec::with_capacity(w.len() / QK * 34);
    for b in w.chunks_exact(QK) {
        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(
            b.iter()
                .map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}
