//! Portable kernels: one weight row . one activation row at a time, the
//! integer dot product of each 32-value block summed exactly in i32 and
//! then scaled (see `lib.rs` for the arithmetic).

use crate::act::Acts;
use crate::formats::{I8, U4};
use crate::Tile;

pub(crate) struct U4Tile<'a> {
    pub w: &'a U4,
    pub acts: &'a Acts,
}

pub(crate) struct I8Tile<'a> {
    pub w: &'a I8,
    pub acts: &'a Acts,
}

/// `sum_b d_w d_x sum_j q_w q_x + m_w s_x` over the blocks of row `r` and
/// activation row `a`.
fn dot_u4(w: &U4, acts: &Acts, r: usize, a: usize) -> f32 {
    let nb = w.nb;
    let (wr, ar) = (r * nb..(r + 1) * nb, a * nb..(a + 1) * nb);
    let mut acc = 0f32;
    for ((wq, (&d, &m)), (aq, (&dx, &s))) in w.qs[wr.clone()]
        .iter()
        .zip(w.d[wr.clone()].iter().zip(&w.m[wr]))
        .zip(
            acts.qs[ar.clone()]
                .iter()
                .zip(acts.d[ar.clone()].iter().zip(&acts.s[ar])),
        )
    {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (wq.0[j] & 0xF) as i32 * aq.0[j] as i32
                + (wq.0[j] >> 4) as i32 * aq.0[j + 16] as i32;
        }
        acc += d * dx * isum as f32 + m * s;
    }
    acc
}

/// `sum_b d_x d_w sum_j q_w q_x (+ m s_x)`.
fn dot_i8(w: &I8, acts: &Acts, r: usize, a: usize) -> f32 {
    let nb = w.nb;
    let (wr, ar) = (r * nb..(r + 1) * nb, a * nb..(a + 1) * nb);
    let mut acc = 0f32;
    for ((wq, &dw), (aq, &dx)) in w.qs[wr.clone()]
        .iter()
        .zip(&w.d[wr.clone()])
        .zip(acts.qs[ar.clone()].iter().zip(&acts.d[ar.clone()]))
    {
        let sum: i32 =
            wq.0.iter()
                .zip(&aq.0)
                .map(|(&w, &x)| w as i32 * x as i32)
                .sum();
        acc += dx * dw * sum as f32;
    }
    if let Some(m) = &w.m {
        acc += m[wr]
            .iter()
            .zip(&acts.s[ar])
            .map(|(m, s)| m * s)
            .sum::<f32>();
    }
    acc
}

impl Tile for U4Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        std::array::from_fn(|i| std::array::from_fn(|j| dot_u4(self.w, self.acts, r + i, a + j)))
    }
}

impl Tile for I8Tile<'_> {
    fn tile<const R: usize, const A: usize>(&self, r: usize, a: usize) -> [[f32; A]; R] {
        std::array::from_fn(|i| std::array::from_fn(|j| dot_i8(self.w, self.acts, r + i, a + j)))
    }
}
