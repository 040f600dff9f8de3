//! GGUF block formats and their unpacking into the two layouts the kernels
//! work on.
//!
//! Every format is cut into 32-value blocks, each read as one of the
//! following, then stored with eight rows interleaved (`x8/`); the
//! K-quants' super-blocks are unpacked so by `kquants.rs`:
//!
//! - [`U4`]: 32 unsigned 4-bit values `q` in 16 bytes (byte `j` holds value
//!   `j` in its low nibble and value `j + 16` in its high nibble, the
//!   Q4_0/Q4_1 order), a scale `d` and an offset `m`, so that `w = d q + m`.
//!   Q4_0 (`d (q - 8)`, so `m = -8 d`) and Q4_1 (`d q + m`) fit, and
//!   Q4_K with `d = d_K sc`, `m = -dmin mn`.
//! - [`I8`]: 32 signed bytes `q`, a scale `d` and optionally an offset `m`
//!   per block: `w = d q (+ m)`.
//!   Q8_0 (`d q`), Q5_0 (`d (q - 16)`) and Q5_1 (`d q + m`, `q` in 0..32)
//!   fit, and Q5_K with Q4_K's `d` and `m`, and Q6_K (`q - 32`) with a
//!   scale per 16 values.
//!
//! Every weight is reproduced exactly, in as many bytes as the GGUF blocks
//! (scales and offsets stay f16; Q4_0's offset `-8 d` is one too; the
//! K-quants keep their integer sub-block scales), plus the padding of the
//! last group of eight rows; Q5_K's and Q6_K's values take a byte each.

use std::ops::Range;

use half::f16;

use crate::kquants::{unpack_q4k, unpack_q5k, unpack_q6k};
use crate::x8::scales::{Flat, SuperK4, SuperK6};
use crate::x8::{half_lanes, i8::I8x8, u4::U4x8, Group8};
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
    Q5K,
    Q6K,
}

impl Format {
    /// All formats, for tests and tools.
    pub const ALL: [Format; 8] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ];

    /// Values per block (the row length must be a multiple of it).
    pub fn block_values(self) -> usize {
        match self {
            Format::Q4K | Format::Q5K | Format::Q6K => 256,
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
            Format::Q5K => 176,
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
    pub qs: Vec<Nib>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
}

/// Blocks `w_j = d q_j (+ m)` with 8-bit `q`, laid out as [`U4`].
#[derive(Debug)]
pub(crate) struct I8 {
    pub qs: Vec<Q8>,
    pub d: Vec<f32>,
    pub m: Option<Vec<f32>>,
}

#[derive(Debug)]
pub(crate) enum Repr {
    U4x8(U4x8<Flat>),
    I8x8(I8x8<Flat>),
    K4(U4x8<SuperK4>),
    K5(I8x8<SuperK4>),
    K6(I8x8<SuperK6>),
}

/// The f16 at byte `at` of a block.
pub(crate) fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Packs 32 values below 16 in the [`U4`] nibble order.
pub(crate) fn pack_nibbles(v: &[u8; QK]) -> Nib {
    let mut n = Nib::default();
    for j in 0..16 {
        n.0[j] = (v[j] & 0xF) | (v[j + 16] << 4);
    }
    n
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
        Format::Q4K => Repr::K4(unpack_q4k(chunks, n, k)?),
        Format::Q5K => Repr::K5(unpack_q5k(chunks, n, k)?),
        Format::Q6K => Repr::K6(unpack_q6k(chunks, n, k)?),
        Format::Q4_0 | Format::Q4_1 => {
            let mut u = U4 {
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
            let scales = Flat {
                d: half_lanes(&u.d, n, nb)?,
                m: Some(half_lanes(&u.m, n, nb)?),
            };
            Repr::U4x8(U4x8::new(&u.qs, n, nb, scales))
        }
        Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => {
            let has_m = format == Format::Q5_1;
            let mut w = I8 {
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
            let scales = Flat {
                d: half_lanes(&w.d, n, nb)?,
                m: w.m.as_ref().map(|m| half_lanes(m, n, nb)).transpose()?,
            };
            Repr::I8x8(I8x8::new(&w.qs, n, nb, scales))
        }
    })
}

impl Repr {
    /// Appends rows `rows` as f32, row major.
    pub(crate) fn dequantize_rows(&self, rows: Range<usize>, out: &mut Vec<f32>) {
        match self {
            Repr::U4x8(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::I8x8(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::K4(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::K5(w) => rows.for_each(|r| w.dequantize_row(r, out)),
            Repr::K6(w) => rows.for_each(|r| w.dequantize_row(r, out)),
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
