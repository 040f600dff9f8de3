//! Row-major f32 matrix products for the training step, on the `gemm`
//! crate (the kernels candle's CPU matmul uses), with transposes expressed
//! as strides so no operand is ever copied, and optional accumulation into
//! the destination (`dX` of several linears sharing an input sums in place).

use gemm::Parallelism;

/// A row-major matrix operand: `rows x cols` as stored, read transposed
/// when `t` is set (then it stands for a `cols x rows` matrix).
#[derive(Clone, Copy)]
pub(crate) struct M<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub t: bool,
}

impl<'a> M<'a> {
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        debug_assert_eq!(data.len(), rows * cols, "operand size");
        Self {
            data,
            rows,
            cols,
            t: false,
        }
    }

    /// The same storage read as its transpose.
    pub fn t(self) -> Self {
        Self { t: !self.t, ..self }
    }

    /// Rows and columns of the matrix it stands for.
    fn shape(&self) -> (usize, usize) {
        if self.t {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (column stride, row stride) of the matrix it stands for.
    fn strides(&self) -> (isize, isize) {
        if self.t {
            (self.cols as isize, 1)
        } else {
            (1, self.cols as isize)
        }
    }
}

/// Products smaller than this many multiply-adds run on one thread.
const PARALLEL_FROM: usize = 1 << 16;

/// `dst = scale * a b` (or `dst += scale * a b` with `acc`); `dst` is
/// row-major `a.rows' x b.cols'`.
pub(crate) fn matmul(dst: &mut [f32], a: M<'_>, b: M<'_>, scale: f32, acc: bool) {
    let (m, k) = a.shape();
    let (k2, n) = b.shape();
    assert_eq!(k, k2, "inner dimensions differ");
    assert_eq!(dst.len(), m * n, "destination size");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            dst.fill(0.0);
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if threads > 1 && m * n * k >= PARALLEL_FROM {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let (a_cs, a_rs) = a.strides();
    let (b_cs, b_rs) = b.strides();
    // SAFETY: the shapes and strides above address exactly the slices'
    // elements (checked lengths), and `dst` does not alias `a` or `b`
    // (a `&mut` and two `&` borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            acc,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            scale,
            false,
            false,
            false,
            par,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(x: &[f32], r: usize, c: usize) -> Vec<f32> {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = x[i * c + j];
            }
        }
        t
    }

    fn product(a: M<'_>, b: M<'_>) -> Vec<f32> {
        let mut out = vec![0.0; a.shape().0 * b.shape().1];
        matmul(&mut out, a, b, 1.0, false);
        out
    }

    #[test]
    fn every_transpose_and_accumulation_matches_a_naive_product() {
        let (m, k, n) = (37, 29, 41);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let want = naive(&a, &b, m, k, n);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let am = if ta {
                M::new(&at, k, m).t()
            } else {
                M::new(&a, m, k)
            };
            let bm = if tb {
                M::new(&bt, n, k).t()
            } else {
                M::new(&b, k, n)
            };
            let got = product(am, bm);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "{ta} {tb}: {g} vs {w}");
            }
            let mut acc = vec![1.0; m * n];
            matmul(&mut acc, am, bm, 2.0, true);
            for (g, w) in acc.iter().zip(&want) {
                assert!((g - (1.0 + 2.0 * w)).abs() < 1e-3);
            }
        }
    }
}
