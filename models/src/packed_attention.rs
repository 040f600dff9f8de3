//! Bidirectional (encoder) attention over a packed batch, on plain slices.
//!
//! The sequences of a batch are concatenated row after row, with no
//! padding. Attention of one sequence and one head is a handful of small
//! products (`len x head_dim` by `len`); run as candle operations per
//! sequence that was a dozen tensor operations, allocations and thread-pool
//! dispatches per sequence and layer, more than the arithmetic. Here every
//! (sequence, head) pair is one task on the rayon pool: scores, softmax and
//! the weighted sum of values in f32 in one pass over the task's rows,
//! compiled for AVX2 + FMA where present, with a polynomial `exp`
//! (`vecmath.rs`). The task's keys are first copied transposed, so a
//! query's scores are multiply-adds across keys, vectorised, rather than
//! one short dot product (and its horizontal sum) per key.

use std::ops::Range;

use hearth_kernels::TiledRows;
use rayon::prelude::*;

use crate::vecmath;

/// Softmax attention of every sequence over its own rows. `qkv` is `[total,
/// 3 * hidden]` (each row: the query, key and value of one token, each
/// `hidden = heads * head_dim` wide, heads side by side); `lens` are the
/// sequences' lengths in order, summing to `total`. Returns the context
/// `[total, hidden]`, heads side by side.
///
/// # Panics
/// If `qkv`'s length is not `3 * hidden * sum(lens)` or `hidden` is not a
/// multiple of `heads`.
pub(crate) fn packed_attention(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    lens: &[usize],
) -> Vec<f32> {
    let mut ctx = Vec::new();
    attention(qkv, hidden, heads, lens, None, Ctx::Rows(&mut ctx));
    ctx
}

/// [`packed_attention`] into `ctx`, reusing its allocation.
pub(crate) fn packed_attention_into(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    lens: &[usize],
    ctx: &mut Vec<f32>,
) {
    attention(qkv, hidden, heads, lens, None, Ctx::Rows(ctx));
}

/// [`packed_attention`] written regrouped by tiles for the next layer's f32
/// kernel ([`TiledRows`]), with no row-major copy in between.
///
/// # Panics
/// As [`packed_attention`], or if the head size is not a multiple of 8.
pub(crate) fn packed_attention_tiled(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    lens: &[usize],
    ctx: &mut TiledRows,
) {
    assert!(
        heads > 0 && (hidden / heads).is_multiple_of(8),
        "a head size of {} is not whole groups of 8",
        hidden / heads.max(1)
    );
    attention(qkv, hidden, heads, lens, None, Ctx::Tiled(ctx));
}

/// [`packed_attention`] for one query per sequence, `picks[s]` (an index
/// within sequence `s`): the context `[lens.len(), hidden]` of those rows
/// only (over every key of their sequence).
///
/// # Panics
/// As [`packed_attention`], or if a pick is outside its sequence.
pub(crate) fn packed_attention_rows(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    lens: &[usize],
    picks: &[usize],
) -> Vec<f32> {
    assert_eq!(picks.len(), lens.len(), "one pick per sequence");
    assert!(
        picks.iter().zip(lens).all(|(p, l)| p < l),
        "a pick is outside its sequence"
    );
    let mut ctx = Vec::new();
    attention(qkv, hidden, heads, lens, Some(picks), Ctx::Rows(&mut ctx));
    ctx
}

/// Where [`attention`] writes the context.
enum Ctx<'a> {
    /// Row major `[rows, hidden]`.
    Rows(&'a mut Vec<f32>),
    /// Regrouped by tiles.
    Tiled(&'a mut TiledRows),
}

/// One (sequence, head) task: the sequence's first row, its length, the
/// head and the queries to answer (indices within the sequence).
type Task = (usize, usize, usize, Range<usize>);

fn attention(
    qkv: &[f32],
    hidden: usize,
    heads: usize,
    lens: &[usize],
    picks: Option<&[usize]>,
    ctx: Ctx,
) {
    let total: usize = lens.iter().sum();
    assert_eq!(
        qkv.len(),
        3 * hidden * total,
        "qkv is not [{total}, 3 x {hidden}]"
    );
    assert!(
        heads > 0 && hidden.is_multiple_of(heads),
        "{hidden} does not split into {heads} heads"
    );
    let hd = hidden / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut tasks: Vec<Task> = Vec::with_capacity(lens.len() * heads);
    let mut offset = 0;
    for (s, &len) in lens.iter().enumerate() {
        let queries = picks.map_or(0..len, |p| p[s]..p[s] + 1);
        tasks.extend((0..heads).map(|head| (offset, len, head, queries.clone())));
        offset += len;
    }
    let shape = Shape { hidden, hd, scale };
    // Output rows: every token, or one per sequence.
    let rows = if picks.is_some() { lens.len() } else { total };
    // Every element is written by exactly one task below; zeroing only
    // touches new capacity.
    let (out, tiled) = match ctx {
        Ctx::Rows(v) => {
            v.resize(rows * hidden, 0.0);
            (CtxPtr(v.as_mut_ptr()), None)
        }
        Ctx::Tiled(t) => {
            t.reshape(rows, hidden);
            (CtxPtr(t.as_mut_ptr()), Some(t.index()))
        }
    };
    let run = |b: &mut Buffers, (t, task): (usize, &Task)| {
        #[cfg(target_arch = "x86_64")]
        if vecmath::has_fma() {
            #[target_feature(enable = "avx2,fma,f16c")]
            fn fast(qkv: &[f32], s: Shape, task: &Task, b: &mut Buffers) {
                attend::<true>(qkv, s, task, b)
            }
            // SAFETY: the CPU has the features `fast` is compiled for.
            unsafe { fast(qkv, shape, task, b) };
        } else {
            attend::<false>(qkv, shape, task, b);
        }
        #[cfg(not(target_arch = "x86_64"))]
        attend::<false>(qkv, shape, task, b);
        let (offset, _, head, ref queries) = *task;
        let first_row = if picks.is_some() {
            t / heads
        } else {
            offset + queries.start
        };
        // `b.o` may be longer (kept from a longer task).
        for (i, r) in b.o[..queries.len() * hd].chunks_exact(hd).enumerate() {
            let row = first_row + i;
            // SAFETY (both arms): the places written lie in the context's
            // buffer (row < rows, head * hd + hd <= hidden; `offset`
            // checks its bounds), and no other task writes them: tasks
            // differ in their sequence (so rows) or head (so columns). The
            // buffer outlives the loop.
            match tiled {
                None => unsafe {
                    std::ptr::copy_nonoverlapping(r.as_ptr(), out.at(row * hidden + head * hd), hd)
                },
                // Runs of 8 (the head size is a multiple of 8).
                Some(index) => {
                    for (j, eight) in r.chunks_exact(8).enumerate() {
                        let eight: &[f32; 8] = eight.try_into().expect("8 values");
                        let at = index.offset(row, head * hd + 8 * j);
                        unsafe { out.at(at).cast::<[f32; 8]>().write_unaligned(*eight) };
                    }
                }
            }
        }
    };
    if tasks.len() > 1 {
        tasks
            .par_iter()
            .enumerate()
            .for_each_init(Buffers::default, run);
    } else {
        let mut b = Buffers::default();
        tasks.iter().enumerate().for_each(|task| run(&mut b, task));
    }
}

/// `ctx`'s buffer, written by the tasks at disjoint places.
#[derive(Clone, Copy)]
struct CtxPtr(*mut f32);
impl CtxPtr {
    /// # Safety
    /// `i` is within the buffer.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: forwarded.
        unsafe { self.0.add(i) }
    }
}

// SAFETY: the tasks write disjoint ranges (see `attention`).
unsafe impl Send for CtxPtr {}
// SAFETY: as above.
unsafe impl Sync for CtxPtr {}

/// A worker's buffers, reused from task to task (never shrunk): the
/// head's keys transposed, a tile's scores, the task's output rows.
#[derive(Default)]
struct Buffers {
    kt: Vec<f32>,
    scores: Vec<f32>,
    o: Vec<f32>,
}

/// The sizes of one [`packed_attention`] call.
#[derive(Clone, Copy)]
struct Shape {
    hidden: usize,
    hd: usize,
    scale: f32,
}

/// Queries per score tile, and keys per block (two AVX2 vectors).
const QT: usize = 4;
const KB: usize = 16;
/// Output values per register-held accumulator (four AVX2 vectors), and
/// queries per pass over the values.
const PV: usize = 32;
const PQ: usize = 2;

/// One sequence (rows `offset..offset + len`), one head, the task's
/// queries: `[queries, hd]` into `b.o`.
///
/// The head's keys are copied transposed (`[hd, len]`, padded to a
/// multiple of 16 keys), so scores come in tiles of 4 queries x 16 keys:
/// 8 vector accumulators (independent chains, enough to keep both FMA
/// units busy), one broadcast query value per query and two 8-key loads
/// per step, no horizontal sums. The weighted sums of the values take two
/// queries at a time for the same reason.
#[inline(always)]
fn attend<const FMA: bool>(qkv: &[f32], s: Shape, task: &Task, b: &mut Buffers) {
    let Shape { hidden, hd, scale } = s;
    let (offset, len, head, ref queries) = *task;
    // Part 0, 1, 2 (query, key, value) of token `t`.
    let at = |t: usize, part: usize| {
        let start = t * 3 * hidden + part * hidden + head * hd;
        &qkv[start..start + hd]
    };
    let lp = len.div_ceil(KB) * KB;
    // No zeroing: every value read below is written first, but for the
    // keys past `len` (old values or zeros, finite), whose scores are
    // replaced before the softmax.
    grow(&mut b.kt, hd * lp);
    transpose_keys::<FMA>(qkv, s, offset, len, head, lp, &mut b.kt);
    let nq = queries.len();
    grow(&mut b.scores, QT * lp);
    grow(&mut b.o, nq * hd);
    for q0 in (0..nq).step_by(QT) {
        // A short last tile repeats its last query (results unused).
        let qs: [&[f32]; QT] =
            std::array::from_fn(|a| at(offset + queries.start + (q0 + a).min(nq - 1), 0));
        for jb in (0..lp).step_by(KB) {
            let mut acc = [[0f32; KB]; QT];
            for d in 0..hd {
                let k: &[f32; KB] = b.kt[d * lp + jb..][..KB].try_into().expect("16 keys");
                for (acc, q) in acc.iter_mut().zip(&qs) {
                    let qd = q[d];
                    for l in 0..KB {
                        acc[l] = vecmath::madd::<FMA>(qd, k[l], acc[l]);
                    }
                }
            }
            for (a, acc) in acc.iter().enumerate() {
                b.scores[a * lp + jb..][..KB].copy_from_slice(acc);
            }
        }
        let tile = QT.min(nq - q0);
        // Over whole vectors, the padding keys at -inf: their weights come
        // out as e^-87 (`exp`'s clamp, ~1.6e-38), below the last bit of a
        // sum that holds the largest score's 1, and are not read. Separate
        // passes, so that each vectorises (a loop that also carries a
        // running max or sum is one serial chain), each over the tile's
        // rows in turn, so that the rows' chains (a reduction's merge, the
        // exponentials) overlap. The weights stay unnormalised: the
        // weighted sums of the values are divided by their row's sum at
        // the end.
        let rows = &mut b.scores[..tile * lp];
        for sc in rows.chunks_exact_mut(lp) {
            sc[len..].fill(f32::NEG_INFINITY);
        }
        rows.iter_mut().for_each(|x| *x *= scale);
        let mut max = [0f32; QT];
        for (m, sc) in max.iter_mut().zip(rows.chunks_exact(lp)) {
            *m = vecmath::max(sc);
        }
        for (&m, sc) in max.iter().zip(rows.chunks_exact_mut(lp)) {
            sc.iter_mut().for_each(|x| *x = vecmath::exp(*x - m));
        }
        let mut inv = [0f32; QT];
        for (inv, sc) in inv.iter_mut().zip(rows.chunks_exact(lp)) {
            *inv = vecmath::sum_by(sc, |x| x);
        }
        inv.iter_mut().for_each(|v| *v = 1.0 / *v);
        for a0 in (0..tile).step_by(PQ) {
            // A lone last query is taken twice (the copy is not stored).
            let rows: [usize; PQ] = std::array::from_fn(|i| (a0 + i).min(tile - 1));
            let probs: [&[f32]; PQ] = rows.map(|a| &b.scores[a * lp..a * lp + len]);
            for col in (0..hd).step_by(PV) {
                let width = PV.min(hd - col);
                // The outputs in registers, 32 values x 2 queries at a time:
                // accumulated in place it was a load and a store per key,
                // each waiting on the last.
                let mut acc = [[0f32; PV]; PQ];
                if width == PV {
                    for j in 0..len {
                        let v: &[f32; PV] = at(offset + j, 2)[col..col + PV]
                            .try_into()
                            .expect("PV values");
                        for (acc, p) in acc.iter_mut().zip(&probs) {
                            let p = p[j];
                            for (acc, &v) in acc.iter_mut().zip(v) {
                                *acc = vecmath::madd::<FMA>(p, v, *acc);
                            }
                        }
                    }
                } else {
                    for j in 0..len {
                        let v = &at(offset + j, 2)[col..];
                        for (acc, p) in acc.iter_mut().zip(&probs) {
                            for (acc, &v) in acc.iter_mut().zip(v) {
                                *acc = vecmath::madd::<FMA>(p[j], v, *acc);
                            }
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate().take(tile - a0) {
                    let out = &mut b.o[(q0 + a0 + i) * hd + col..][..width];
                    let inv = inv[a0 + i];
                    for (o, &v) in out.iter_mut().zip(acc) {
                        *o = v * inv;
                    }
                }
            }
        }
    }
}

/// `v` at least `len` long (new places zeroed, old ones kept).
fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// The head's keys of rows `offset..offset + len` transposed into `kt`
/// (`[hd, lp]`; keys past `len` left as they are): in 8 x 8 blocks on AVX2 (`FMA` is
/// only set where the CPU has it) when the head size is a multiple of 8,
/// else one value at a time (strided stores, one per cycle).
#[inline(always)]
fn transpose_keys<const FMA: bool>(
    qkv: &[f32],
    s: Shape,
    offset: usize,
    len: usize,
    head: usize,
    lp: usize,
    kt: &mut [f32],
) {
    let (hidden, hd) = (s.hidden, s.hd);
    let key = |t: usize| &qkv[t * 3 * hidden + hidden + head * hd..][..hd];
    assert!(kt.len() >= hd * lp && lp >= len);
    #[cfg(target_arch = "x86_64")]
    if FMA && hd.is_multiple_of(8) {
        let keys = &qkv[offset * 3 * hidden..(offset + len) * 3 * hidden];
        // SAFETY: `FMA` is only set in code compiled for (and run on) CPUs
        // with AVX2; `keys` holds `len` rows of `3 hidden` with this head's
        // key `hd` long at `hidden + head * hd`; `kt` holds `hd x lp`.
        return unsafe { transpose_avx2(keys, 3 * hidden, hidden + head * hd, hd, lp, kt) };
    }
    for j in 0..len {
        for (d, &k) in key(offset + j).iter().enumerate() {
            kt[d * lp + j] = k;
        }
    }
}

/// `kt[d * lp + j] = rows[j * stride + at + d]` for `d < hd`, in 8 x 8
/// blocks (the places of keys past the last are left as they are).
///
/// # Safety
/// The CPU has AVX2; `hd` is a multiple of 8, `at + hd <= stride`, `kt`
/// holds `hd x lp` and `lp` is at least the rows' count rounded up to 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(
    rows: &[f32],
    stride: usize,
    at: usize,
    hd: usize,
    lp: usize,
    kt: &mut [f32],
) {
    use std::arch::x86_64::*;
    let len = rows.len() / stride;
    assert!(at + hd <= stride && kt.len() >= hd * lp);
    assert!(hd.is_multiple_of(8) && lp >= len.next_multiple_of(8));
    for j0 in (0..len).step_by(8) {
        for d0 in (0..hd).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, r) in r.iter_mut().enumerate().take(len - j0) {
                let key = &rows[(j0 + i) * stride + at + d0..][..8];
                *r = _mm256_loadu_ps(key.as_ptr());
            }
            let t = [
                _mm256_unpacklo_ps(r[0], r[1]),
                _mm256_unpackhi_ps(r[0], r[1]),
                _mm256_unpacklo_ps(r[2], r[3]),
                _mm256_unpackhi_ps(r[2], r[3]),
                _mm256_unpacklo_ps(r[4], r[5]),
                _mm256_unpackhi_ps(r[4], r[5]),
                _mm256_unpacklo_ps(r[6], r[7]),
                _mm256_unpackhi_ps(r[6], r[7]),
            ];
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            for i in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(u[i], u[i + 4]);
                let hi = _mm256_permute2f128_ps::<0x31>(u[i], u[i + 4]);
                _mm256_storeu_ps(kt[(d0 + i) * lp + j0..][..8].as_mut_ptr(), lo);
                _mm256_storeu_ps(kt[(d0 + i + 4) * lp + j0..][..8].as_mut_ptr(), hi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Result, Tensor};

    use super::*;

    /// Plain candle attention of one sequence: `[len, 3h]` -> `[len, h]`.
    fn reference(rows: &Tensor, h: usize, heads: usize) -> Result<Tensor> {
        let (len, _) = rows.dims2()?;
        let hd = h / heads;
        let split = |i: usize| -> Result<Tensor> {
            rows.narrow(1, i * h, h)?
                .reshape((len, heads, hd))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        probs.matmul(&v)?.transpose(0, 1)?.reshape((len, h))
    }

    #[test]
    fn matches_candle_attention_per_sequence() -> Result<()> {
        // Head sizes 8, 32 and 40: under, at, and past one register-held
        // block of outputs (`PV`).
        for (h, heads) in [(24, 3), (96, 3), (80, 2)] {
            let lens = [5usize, 1, 17, 9];
            let total: usize = lens.iter().sum();
            let qkv = Tensor::randn(0f32, 1.0, (total, 3 * h), &Device::Cpu)?;
            let got = packed_attention(&qkv.flatten_all()?.to_vec1()?, h, heads, &lens);
            let got = Tensor::from_vec(got, (total, h), &Device::Cpu)?;
            let mut offset = 0;
            for len in lens {
                let want = reference(&qkv.narrow(0, offset, len)?, h, heads)?;
                let diff = (got.narrow(0, offset, len)? - want)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?;
                assert!(diff < 1e-5, "h {h}, sequence at {offset}: max diff {diff}");
                offset += len;
            }
        }
        Ok(())
    }

    #[test]
    fn picked_rows_equal_those_rows_of_the_full_context() {
        let (h, heads) = (16, 2);
        let lens = [5usize, 1, 9];
        let total: usize = lens.iter().sum();
        let qkv: Vec<f32> = (0..total * 3 * h)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02)
            .collect();
        let full = packed_attention(&qkv, h, heads, &lens);
        let picks = [4usize, 0, 3];
        let rows = packed_attention_rows(&qkv, h, heads, &lens, &picks);
        assert_eq!(rows.len(), lens.len() * h);
        let starts = [0usize, 5, 6];
        for (s, (&start, &pick)) in starts.iter().zip(&picks).enumerate() {
            let want = &full[(start + pick) * h..][..h];
            assert_eq!(&rows[s * h..][..h], want, "sequence {s}");
        }
    }

    #[test]
    fn a_sequence_sees_only_its_own_rows() {
        // Two sequences of one token: each one's context is its own value.
        let (h, heads) = (4, 2);
        let qkv: Vec<f32> = (0..2 * 3 * h).map(|i| i as f32 * 0.1).collect();
        let ctx = packed_attention(&qkv, h, heads, &[1, 1]);
        assert_eq!(&ctx[..h], &qkv[2 * h..3 * h]);
        assert_eq!(&ctx[h..], &qkv[3 * h + 2 * h..6 * h]);
    }
}
