//! Reference quantizers for the tests: f32 rows to GGUF block bytes in
//! llama.cpp's layouts, written from the format descriptions (simple
//! round-to-nearest, not llama.cpp's error-minimizing searches). Each also
//! returns the values the blocks decode to, computed here independently of
//! the crate's unpacking.

#![allow(dead_code)]

use half::f16;
use hearth_kernels::Format;

/// xorshift64* in [-1, 1).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        v as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Values with a mix of magnitudes per 32-block (some blocks 10x larger,
    /// a few values as outliers) so the scales vary.
    pub fn matrix(&mut self, len: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(len);
        let mut scale = 1.0;
        for i in 0..len {
            if i % 32 == 0 {
                scale = if self.next_f32() > 0.6 { 10.0 } else { 1.0 };
            }
            let mut v = self.next_f32() * scale;
            if self.next_f32() > 0.97 {
                v *= 4.0;
            }
            out.push(v);
        }
        out
    }
}

fn f16r(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

fn push_f16(out: &mut Vec<u8>, x: f32) -> f32 {
    let h = f16::from_f32(x);
    out.extend_from_slice(&h.to_le_bytes());
    h.to_f32()
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn qround(v: f32, lo: f32, hi: f32) -> u8 {
    v.round().clamp(lo, hi) as i32 as u8
}

/// Bytes of 32 4-bit values, value `j` low nibble / `j + 16` high nibble.
fn nibbles(q: &[u8]) -> [u8; 16] {
    std::array::from_fn(|j| q[j] | (q[j + 16] << 4))
}

/// Quantizes `w` (length a multiple of the block size) to `format`; returns
/// the bytes, the decoded values, and the offset `m` of each 32 values in
/// `w = d q + m` where the kernels use one (Q4_0's `-8 d`, Q5_0's `-16 d`,
/// Q4_1, Q5_1, Q4_K's and Q5_K's `-dmin mn`; 0 for Q8_0, Q6_K and Q3_K,
/// whose offsets live in `q`, and for Q2_K, whose 16-value mins the
/// kernels multiply by the activations' exact integer sums).
pub fn quantize(format: Format, w: &[f32]) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (mut out, mut deq) = (Vec::new(), Vec::with_capacity(w.len()));
    let mut offsets = Vec::new();
    for b in w.chunks_exact(format.block_values()) {
        let before = deq.len();
        match format {
            Format::Q4_0 | Format::Q5_0 | Format::Q8_0 => {
                let (bits, bias) = match format {
                    Format::Q4_0 => (4, 8.0),
                    Format::Q5_0 => (5, 16.0),
                    _ => (8, 0.0),
                };
                let qmax = ((1u32 << (bits - 1)) - 1) as f32;
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = push_f16(&mut out, amax / qmax);
                let q: Vec<u8> = b
                    .iter()
                    .map(|&v| qround(v * inv(d) + bias, 0.0, (2.0 * bias - 1.0).max(0.0)))
                    .collect();
                match format {
                    Format::Q8_0 => {
                        // Signed bytes: recompute without the unsigned clamp.
                        for &v in b {
                            let q = (v * inv(d)).round().clamp(-127.0, 127.0);
                            out.push(q as i8 as u8);
                            deq.push(d * q);
                        }
                    }
                    Format::Q4_0 => {
                        offsets.push(-8.0 * d);
                        out.extend_from_slice(&nibbles(&q));
                        deq.extend(q.iter().map(|&q| d * q as f32 + -8.0 * d));
                    }
                    _ => {
                        offsets.push(-16.0 * d);
                        let qh: u32 = (0..32).map(|j| ((q[j] as u32 >> 4) & 1) << j).sum();
                        out.extend_from_slice(&qh.to_le_bytes());
                        let low: Vec<u8> = q.iter().map(|v| v & 0xF).collect();
                        out.extend_from_slice(&nibbles(&low));
                        deq.extend(q.iter().map(|&q| d * (q as f32 - 16.0)));
                    }
                }
            }
            Format::Q4_1 | Format::Q5_1 => {
                let qmax = if format == Format::Q4_1 { 15.0 } else { 31.0 };
                let min = b.iter().fold(f32::MAX, |a, &v| a.min(v));
                let max = b.iter().fold(f32::MIN, |a, &v| a.max(v));
                let d = push_f16(&mut out, (max - min) / qmax);
                let m = push_f16(&mut out, min);
                let q: Vec<u8> = b
                    .iter()
                    .map(|&v| qround((v - m) * inv(d), 0.0, qmax))
                    .collect();
                if format == Format::Q5_1 {
                    let qh: u32 = (0..32).map(|j| ((q[j] as u32 >> 4) & 1) << j).sum();
                    out.extend_from_slice(&qh.to_le_bytes());
                }
                let low: Vec<u8> = q.iter().map(|v| v & 0xF).collect();
                out.extend_from_slice(&nibbles(&low));
                deq.extend(q.iter().map(|&q| d * q as f32 + m));
                offsets.push(m);
            }
            Format::Q4K => quantize_q4k(b, &mut out, &mut deq, &mut offsets),
            Format::Q5K => quantize_q5k(b, &mut out, &mut deq, &mut offsets),
            Format::Q2K => quantize_q2k(b, &mut out, &mut deq),
            Format::Q3K => quantize_q3k(b, &mut out, &mut deq),
            Format::Q6K => quantize_q6k(b, &mut out, &mut deq),
        }
        offsets.resize((before + b.len()) / 32, 0.0);
    }
    (out, deq, offsets)
}

/// The head of a Q4_K / Q5_K super-block for values of `levels` steps
/// per 32: `d`, `dmin` (f16) and 12 bytes of 6-bit scales and mins, pushed
/// to `out`; returns each sub-block's factor `d sc_s` and min `dmin mn_s`.
fn k4_head(b: &[f32], levels: f32, out: &mut Vec<u8>) -> ([f32; 8], [f32; 8]) {
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for s in 0..8 {
        let sb = &b[32 * s..32 * s + 32];
        let lo = sb.iter().fold(0f32, |a, &v| a.min(v)); // <= 0
        let hi = sb.iter().fold(f32::MIN, |a, &v| a.max(v));
        scale[s] = (hi - lo) / levels;
        minv[s] = -lo;
    }
    let d = push_f16(out, scale.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
    let dmin = push_f16(out, minv.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
    let sc: [u8; 8] = std::array::from_fn(|s| qround(scale[s] * inv(d), 0.0, 63.0));
    let mn: [u8; 8] = std::array::from_fn(|s| qround(minv[s] * inv(dmin), 0.0, 63.0));
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    out.extend_from_slice(&packed);
    (
        std::array::from_fn(|s| d * sc[s] as f32),
        std::array::from_fn(|s| dmin * mn[s] as f32),
    )
}

/// The values of a Q4_K / Q5_K super-block (`levels` steps), decoded into
/// `deq` and their offsets into `offsets`.
fn k4_values(
    b: &[f32],
    levels: f32,
    (ds, ms): ([f32; 8], [f32; 8]),
    deq: &mut Vec<f32>,
    offsets: &mut Vec<f32>,
) -> [u8; 256] {
    let mut q = [0u8; 256];
    for s in 0..8 {
        offsets.push(-ms[s]);
        for l in 0..32 {
            let v = b[32 * s + l];
            q[32 * s + l] = qround((v + ms[s]) * inv(ds[s]), 0.0, levels);
            deq.push(ds[s] * q[32 * s + l] as f32 + -ms[s]);
        }
    }
    q
}

/// One Q4_K super-block: `d`, `dmin` (f16), 12 bytes of 6-bit scales and
/// mins, 128 bytes of nibbles (per 64 values: low nibbles = first 32, high
/// nibbles = next 32). Value = `d sc_s q - dmin mn_s` for sub-block `s`.
fn quantize_q4k(b: &[f32], out: &mut Vec<u8>, deq: &mut Vec<f32>, offsets: &mut Vec<f32>) {
    let head = k4_head(b, 15.0, out);
    let q = k4_values(b, 15.0, head, deq, offsets);
    for c in 0..4 {
        for l in 0..32 {
            out.push(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
        }
    }
}

/// One Q5_K super-block: Q4_K's head, then `qh[32]` (bit `2 c` of byte `l`
/// is the fifth bit of value `64 c + l`, bit `2 c + 1` that of `64 c + 32 +
/// l`), then Q4_K's nibbles of the low four bits.
fn quantize_q5k(b: &[f32], out: &mut Vec<u8>, deq: &mut Vec<f32>, offsets: &mut Vec<f32>) {
    let head = k4_head(b, 31.0, out);
    let q = k4_values(b, 31.0, head, deq, offsets);
    for l in 0..32 {
        out.push((0..8).map(|bit| ((q[32 * bit + l] >> 4) & 1) << bit).sum());
    }
    for c in 0..4 {
        for l in 0..32 {
            out.push((q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4));
        }
    }
}

/// One Q2_K super-block, as ggml lays it out: 16 bytes of 4-bit scales
/// (low nibble) and mins (high nibble), one per 16 values, `qs[64]`, `d`
/// and `dmin` (f16). Value `i` = `d sc_g q - dmin mn_g` for its 16-value
/// group `g` and `q` in 0..4, `128 h + 32 j + t` (`h` in 0..2, `j` in 0..4,
/// `t` in 0..32) keeping its two bits at bits `2 j` of `qs[32 h + t]`.
fn quantize_q2k(b: &[f32], out: &mut Vec<u8>, deq: &mut Vec<f32>) {
    let (mut scale, mut minv) = ([0f32; 16], [0f32; 16]);
    for g in 0..16 {
        let sb = &b[16 * g..16 * g + 16];
        let lo = sb.iter().fold(0f32, |a, &v| a.min(v)); // <= 0
        let hi = sb.iter().fold(f32::MIN, |a, &v| a.max(v));
        scale[g] = (hi - lo) / 3.0;
        minv[g] = -lo;
    }
    let d = f16r(scale.iter().fold(0f32, |a, &v| a.max(v)) / 15.0);
    let dmin = f16r(minv.iter().fold(0f32, |a, &v| a.max(v)) / 15.0);
    let sc: [u8; 16] = std::array::from_fn(|g| qround(scale[g] * inv(d), 0.0, 15.0));
    let mn: [u8; 16] = std::array::from_fn(|g| qround(minv[g] * inv(dmin), 0.0, 15.0));
    let mut qs = [0u8; 64];
    for (i, &v) in b.iter().enumerate() {
        let g = i / 16;
        let (ds, ms) = (d * sc[g] as f32, dmin * mn[g] as f32);
        let q = qround((v + ms) * inv(ds), 0.0, 3.0);
        deq.push(ds * q as f32 + -ms);
        let (h, j, t) = (i / 128, (i % 128) / 32, i % 32);
        qs[32 * h + t] |= q << (2 * j);
    }
    out.extend((0..16).map(|g| sc[g] | (mn[g] << 4)));
    out.extend_from_slice(&qs);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(dmin).to_le_bytes());
}

/// One Q3_K super-block, as ggml lays it out: `hmask[32]`, `qs[64]`, 12
/// bytes of 6-bit scales, `d` (f16). Value `i` = `d (sc_g - 32) (q - 4)`
/// for its 16-value group `g` and `q` in 0..8, `128 h + 32 j + t` (`h` in
/// 0..2, `j` in 0..4, `t` in 0..32) keeping its low two bits at bits `2 j`
/// of `qs[32 h + t]` and its high bit at bit `4 h + j` of `hmask[t]`.
/// Scale `g`'s low four bits are the low (`g < 8`) or high nibble of byte
/// `g % 8`, its top two bits `2 (g / 4)` of byte `8 + g % 4`.
fn quantize_q3k(b: &[f32], out: &mut Vec<u8>, deq: &mut Vec<f32>) {
    // The group's largest magnitude lands on -4 (the scale takes its
    // sign), the one end of -4..4 that is exact.
    let gscale: [f32; 16] = std::array::from_fn(|g| {
        let far = b[16 * g..16 * g + 16]
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        -far / 4.0
    });
    let d = f16r(gscale.iter().fold(0f32, |a, &v| a.max(v.abs())) / 31.0);
    // Signed scales in -32..32, stored with 32 added.
    let sc: [i32; 16] =
        std::array::from_fn(|g| (gscale[g] * inv(d)).round().clamp(-32.0, 31.0) as i32);
    let mut q = [0u8; 256];
    for (i, &v) in b.iter().enumerate() {
        let ds = d * sc[i / 16] as f32;
        q[i] = qround(v * inv(ds) + 4.0, 0.0, 7.0);
        deq.push(ds * (q[i] as f32 - 4.0));
    }
    let (mut hmask, mut qs, mut scales) = ([0u8; 32], [0u8; 64], [0u8; 12]);
    for (i, &v) in q.iter().enumerate() {
        let (h, j, t) = (i / 128, (i % 128) / 32, i % 32);
        qs[32 * h + t] |= (v & 3) << (2 * j);
        hmask[t] |= (v >> 2) << (4 * h + j);
    }
    for (g, &s) in sc.iter().enumerate() {
        let u = (s + 32) as u8;
        scales[g % 8] |= (u & 0xF) << (4 * (g / 8));
        scales[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&qs);
    out.extend_from_slice(&scales);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
}

/// One Q6_K super-block: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits),
/// 16 signed 8-bit scales (one per 16 values), `d` (f16). Value = `d sc_g
/// (q - 32)`. Within each 128-value half, byte `l < 32` of `ql` holds values
/// `l` (low nibble) and `l + 64` (high), byte `l + 32` values `l + 32` and
/// `l + 96`; byte `l` of `qh` holds the high bits of `l`, `l + 32`, `l + 64`,
/// `l + 96` at bits 0, 2, 4, 6.
fn quantize_q6k(b: &[f32], out: &mut Vec<u8>, deq: &mut Vec<f32>) {
    let gscale: [f32; 16] = std::array::from_fn(|g| {
        let amax = b[16 * g..16 * g + 16]
            .iter()
            .fold(0f32, |a, v| a.max(v.abs()));
        amax / 31.0
    });
    let d = f16r(gscale.iter().fold(0f32, |a, &v| a.max(v)) / 127.0);
    let sc: [i8; 16] =
        std::array::from_fn(|g| (gscale[g] * inv(d)).round().clamp(-127.0, 127.0) as i8);
    let mut q = [0u8; 256];
    for (i, &v) in b.iter().enumerate() {
        let ds = d * sc[i / 16] as f32;
        q[i] = qround(v * inv(ds) + 32.0, 0.0, 63.0);
        deq.push(ds * (q[i] as f32 - 32.0));
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for half in 0..2 {
        let q = &q[128 * half..];
        for l in 0..32 {
            ql[64 * half + l] = (q[l] & 0xF) | ((q[l + 64] & 0xF) << 4);
            ql[64 * half + l + 32] = (q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4);
            qh[32 * half + l] = (q[l] >> 4)
                | ((q[l + 32] >> 4) << 2)
                | ((q[l + 64] >> 4) << 4)
                | ((q[l + 96] >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
}
