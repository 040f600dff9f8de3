//! GGUF block formats and their unpacking into the layouts the kernels
//! work on.
//!
//! Every format is cut into 32-value blocks, each read as one of the
//! following, then stored with eight rows interleaved (`x8/`); the
//! K-quants' super-blocks are unpacked so by `kquants.rs`:
//!
//! - 4-bit values `q` in 16 bytes (byte `j` holds value `j` in its low
//!   nibble and value `j + 16` in its high nibble, the Q4_0/Q4_1 order), a
//!   scale `d` and an offset `m`, so that `w = d q + m`: Q4_0 (`d (q -
//!   8)`, so `m = -8 d`), Q4_1 (`d q + m`), and Q4_K with `d = d_K sc`, `m
//!   = -dmin mn`;
//! - the same with a fifth bit per value: Q5_0 (`m = -16 d`), Q5_1, Q5_K;
//! - signed bytes `q` with a scale `d`: Q8_0, and Q6_K (`q - 32`, kept as
//!   packed 6-bit values) with a scale per 16 values, and Q3_K (`q - 4`,
//!   packed 3-bit values) with Q6_K's scales;
//! - 2-bit values with a 4-bit scale and min per 16 values under f16
//!   super-block factors: Q2_K (`x8/k2.rs`).
//!
//! Every weight is reproduced exactly, in as many bytes as the GGUF blocks
//! (scales and offsets stay f16; Q4_0's and Q5_0's offsets `-8 d` and `-16
//! d` are too; the K-quants keep their integer sub-block scales), plus the
//! padding of the last group of eight rows. Q8_0 values take a byte each;
//! the others stay packed to their bit widths.

use std::ops::Range;

use half::f16;

use crate::kquants::{unpack_q2k, unpack_q3k, unpack_q45k, unpack_q6k};
use crate::x8::i8::{I3x8, I6x8, I8x8};
use crate::x8::k2::K2x8;
use crate::x8::scales::{Flat, SuperK3, SuperK4, SuperK6};
use crate::x8::u4::{U4x8, U5x8};
use crate::x8::{half_lanes, Group8};
use crate::Error;

/// A GGUF (GGML) block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl Format {
    /// All formats, for tests and tools.
    pub const ALL: [Format; 10] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ];

    /// Values per block (the row length must be a multiple of it).
    pub fn block_values(self) -> usize {
        match self {
            Format::Q2K | Format::Q3K | Format::Q4K | Format::Q5K | Format::Q6K => 256,
            _ => 32,
        }
    }

    /// Activation values that share one 8-bit scale when they meet this
    /// format's weights in a product of `rows` activation rows: 256 (one
    /// super-block, as llama.cpp's Q8_K) for Q2_K and Q3_K; for Q4_K, Q5_K
    /// and Q6_K on CPUs without AVX-512 VNNI (every instruction set of such
    /// a CPU, the portable loops included, so they all agree), whose
    /// kernels then sum a whole super-block in integers under one float
    /// operation; and on CPUs with it for Q4_K, Q5_K and Q6_K in products
    /// of more than [`crate::x8::PREFETCH_MAX_ROWS`] rows (prompt steps,
    /// bound by compute), whose kernels add a super-block's blocks in
    /// floats before the span's scale (Q4_K, Q5_K:
    /// `x8::wide::Sums::SpanOffsets`, one multiply fewer per block and
    /// row) or sum it in integers as without VNNI (Q6_K:
    /// `x8::wide::Sums::Span6`, one float operation per super-block). 32
    /// for the others, and for these three in decode steps of up to that
    /// many rows on CPUs with VNNI, which are bound by memory and kept as
    /// they were measured fastest, unless [`crate::set_batch_invariant`]
    /// asked for 256 there too. (`HEARTH_KERNELS_AVX512=0` counts as a CPU
    /// without AVX-512 VNNI here.)
    pub fn activation_span(self, rows: usize) -> usize {
        match self {
            Format::Q2K | Format::Q3K => 256,
            Format::Q4K | Format::Q5K | Format::Q6K
                if rows > crate::x8::PREFETCH_MAX_ROWS
                    || !crate::wide_kernels()
                    || crate::batch_invariant() =>
            {
                256
            }
            _ => QK,
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
            Format::Q2K => 84,
            Format::Q3K => 110,
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

/// Blocks `w = d q + m` with 4-bit `q` (or 5-bit, the fifth bits in
/// `high`: bit `j` for value `j`); block `b` of row `r` at `r * nb + b`.
#[derive(Debug)]
struct U4 {
    qs: Vec<Nib>,
    high: Vec<u32>,
    d: Vec<f32>,
    m: Vec<f32>,
}

/// `$body` with `$w` bound to the layout inside `$repr`, whichever it is:
/// every arm is compiled for its own layout type.
macro_rules! with_layout {
    ($repr:expr, $w:ident => $body:expr) => {
        match $repr {
            Repr::U4x8($w) => $body,
            Repr::U5x8($w) => $body,
            Repr::I8x8($w) => $body,
            Repr::K4($w) => $body,
            Repr::K5($w) => $body,
            Repr::K6($w) => $body,
            Repr::K3($w) => $body,
            Repr::K2($w) => $body,
        }
    };
}
pub(crate) use with_layout;

#[derive(Debug)]
pub(crate) enum Repr {
    U4x8(U4x8<Flat>),
    U5x8(U5x8<Flat>),
    I8x8(I8x8<Flat>),
    K4(U4x8<SuperK4>),
    K5(U5x8<SuperK4>),
    K6(I6x8<SuperK6>),
    K3(I3x8<SuperK3>),
    K2(K2x8),
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
        Format::Q4K => Repr::K4(unpack_q45k(chunks, n, k)?),
        Format::Q5K => Repr::K5(unpack_q45k(chunks, n, k)?),
        Format::Q2K => Repr::K2(unpack_q2k(chunks, n, k)?),
        Format::Q3K => Repr::K3(unpack_q3k(chunks, n, k)?),
        Format::Q6K => Repr::K6(unpack_q6k(chunks, n, k)?),
        Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 => {
            let five = matches!(format, Format::Q5_0 | Format::Q5_1);
            let mut u = U4 {
                qs: Vec::with_capacity(total),
                high: Vec::with_capacity(if five { total } else { 0 }),
                d: Vec::with_capacity(total),
                m: Vec::with_capacity(total),
            };
            for b in chunks {
                let d = h(b, 0);
                u.d.push(d);
                // d, (m), (4 bytes of fifth bits: bit j for value j), nibbles.
                let (m, at) = match format {
                    Format::Q4_0 => (-8.0 * d, 2),
                    Format::Q4_1 => (h(b, 2), 4),
                    Format::Q5_0 => (-16.0 * d, 2),
                    _ => (h(b, 2), 4),
                };
                u.m.push(m);
                let at = if five {
                    u.high.push(u32::from_le_bytes(
                        b[at..at + 4].try_into().expect("4 bytes"),
                    ));
                    at + 4
                } else {
                    at
                };
                u.qs.push(Nib(b[at..at + 16].try_into().expect("16 bytes")));
            }
            let scales = Flat {
                d: half_lanes(&u.d, n, nb)?,
                m: Some(half_lanes(&u.m, n, nb)?),
            };
            if five {
                Repr::U5x8(U5x8::new(&u.qs, Some(&u.high), n, nb, scales))
            } else {
                Repr::U4x8(U4x8::new(&u.qs, None, n, nb, scales))
            }
        }
        Format::Q8_0 => {
            let mut d = Vec::with_capacity(total);
            let mut qs = Vec::with_capacity(total);
            for b in chunks {
                d.push(h(b, 0));
                qs.push(Q8(std::array::from_fn(|j| b[2 + j] as i8)));
            }
            let scales = Flat {
                d: half_lanes(&d, n, nb)?,
                m: None,
            };
            Repr::I8x8(I8x8::new(&qs, n, nb, scales))
        }
    })
}

impl Repr {
    /// Appends rows `rows` as f32, row major.
    pub(crate) fn dequantize_rows(&self, rows: Range<usize>, out: &mut Vec<f32>) {
        with_layout!(self, w => rows.for_each(|r| w.dequantize_row(r, out)))
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
