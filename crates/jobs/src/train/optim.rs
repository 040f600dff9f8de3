//! AdamW, the learning-rate schedule, gradient clipping and the seeded RNG.

use crate::Schedule;

/// SplitMix64: small, fast, and the same on every platform, so shuffles,
/// LoRA init and dropout masks are reproducible from the seed alone.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator keyed on several numbers (seed, step, layer...).
    pub fn from_parts(parts: &[u64]) -> Self {
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        for &p in parts {
            r.0 ^= p;
            r.0 = r.next_u64();
        }
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Learning rate of optimizer step `step` (1-based) of `total`: linear
/// warmup over the first `ceil(warmup_ratio * total)` steps (step `s` of `W`
/// gets `lr * s / W`), then cosine (or linear) decay: step `W + 1 + i` gets
/// `lr * f(i / (total - W))` with `f(p) = (1 + cos(pi p)) / 2` (or `1 - p`),
/// so the first step after warmup runs at the full rate and the rate
/// approaches 0 at the end.
pub fn learning_rate(
    base: f64,
    step: usize,
    total: usize,
    warmup_ratio: f64,
    schedule: Schedule,
) -> f64 {
    let warmup = ((warmup_ratio.clamp(0.0, 1.0) * total as f64).ceil() as usize).min(total);
    if step <= warmup {
        return base * step as f64 / warmup.max(1) as f64;
    }
    let p = (step - warmup - 1) as f64 / (total - warmup).max(1) as f64;
    match schedule {
        Schedule::Cosine => base * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()),
        Schedule::Linear => base * (1.0 - p),
    }
}

/// Global L2 norm of all gradients; when `max_norm > 0` and the norm is
/// larger, scales them by `max_norm / (norm + 1e-6)` (PyTorch's
/// `clip_grad_norm_`). Returns the norm before clipping.
pub fn clip_grad_norm(grads: &mut [Vec<f32>], max_norm: f64) -> f64 {
    let norm = grads
        .iter()
        .flat_map(|g| g.iter())
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let s = (max_norm / (norm + 1e-6)) as f32;
        grads.iter_mut().flatten().for_each(|x| *x *= s);
    }
    norm
}

/// AdamW (Loshchilov & Hutter; PyTorch's `AdamW`): decoupled weight decay
/// `p -= lr * wd * p`, then `p -= lr * m_hat / (sqrt(v_hat) + eps)` with
/// bias-corrected moments. Moments are f32, arithmetic per element in f64.
#[derive(Debug, Clone)]
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Steps taken.
    pub t: u64,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl AdamW {
    /// Zero moments for parameters of these sizes.
    pub fn new(sizes: &[usize]) -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            t: 0,
            m: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            v: sizes.iter().map(|&n| vec![0.0; n]).collect(),
        }
    }

    pub fn step(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f64, wd: f64) {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        let (b1, b2) = (self.beta1, self.beta2);
        for (((p, g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            for i in 0..p.len() {
                let gi = g[i] as f64;
                let mi = b1 * m[i] as f64 + (1.0 - b1) * gi;
                let vi = b2 * v[i] as f64 + (1.0 - b2) * gi * gi;
                m[i] = mi as f32;
                v[i] = vi as f32;
                let mut pi = p[i] as f64 * (1.0 - lr * wd);
                pi -= lr * (mi / bc1) / ((vi / bc2).sqrt() + self.eps);
                p[i] = pi as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adamw_one_step_by_hand() {
        let mut opt = AdamW::new(&[2]);
        let mut p = vec![vec![1.0f32, -2.0]];
        let g = vec![vec![0.5f32, -0.1]];
        opt.step(&mut p, &g, 0.1, 0.01);
        // t = 1: m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps).
        for (i, (&p0, &gi)) in [1.0f64, -2.0].iter().zip(&[0.5f64, -0.1]).enumerate() {
            let want = p0 * (1.0 - 0.1 * 0.01) - 0.1 * gi / (gi.abs() + 1e-8);
            assert!(
                (p[0][i] as f64 - want).abs() < 1e-6,
                "{} vs {want}",
                p[0][i]
            );
        }
        assert!((opt.m[0][0] - 0.05).abs() < 1e-7);
        assert!((opt.v[0][0] - 0.00025).abs() < 1e-9);
        // Second step, by hand from the moments.
        let g2 = vec![vec![-0.2f32, 0.3]];
        let p1 = p[0].clone();
        opt.step(&mut p, &g2, 0.05, 0.0);
        for i in 0..2 {
            let (g1, gg) = ([0.5f64, -0.1][i], [-0.2f64, 0.3][i]);
            let m = 0.9 * 0.1 * g1 + 0.1 * gg;
            let v = 0.999 * 0.001 * g1 * g1 + 0.001 * gg * gg;
            let mh = m / (1.0 - 0.81);
            let vh = v / (1.0 - 0.999f64 * 0.999);
            let want = p1[i] as f64 - 0.05 * mh / (vh.sqrt() + 1e-8);
            assert!((p[0][i] as f64 - want).abs() < 1e-6);
        }
    }

    #[test]
    fn warmup_then_cosine_and_linear() {
        let lr = |s, sch| learning_rate(1.0, s, 10, 0.2, sch);
        // 2 warmup steps
        assert!((lr(1, Schedule::Cosine) - 0.5).abs() < 1e-12);
        assert!((lr(2, Schedule::Cosine) - 1.0).abs() < 1e-12);
        assert!((lr(3, Schedule::Cosine) - 1.0).abs() < 1e-12);
        let p = 4.0 / 8.0;
        let want = 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
        assert!((lr(7, Schedule::Cosine) - want).abs() < 1e-12);
        assert!((lr(7, Schedule::Linear) - 0.5).abs() < 1e-12);
        assert!((lr(10, Schedule::Linear) - 1.0 / 8.0).abs() < 1e-12);
        // monotone decay after warmup
        for s in 3..10 {
            assert!(lr(s + 1, Schedule::Cosine) < lr(s, Schedule::Cosine));
        }
        // no warmup
        assert_eq!(learning_rate(2.0, 1, 5, 0.0, Schedule::Cosine), 2.0);
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let mut g = vec![vec![3.0f32], vec![4.0f32]];
        let n = clip_grad_norm(&mut g, 1.0);
        assert!((n - 5.0).abs() < 1e-12);
        assert!((g[0][0] - 0.6).abs() < 1e-6 && (g[1][0] - 0.8).abs() < 1e-6);
        let mut g = vec![vec![0.3f32, 0.4]];
        clip_grad_norm(&mut g, 1.0);
        assert_eq!(g[0], vec![0.3, 0.4]);
        let mut g = vec![vec![30.0f32, 40.0]];
        clip_grad_norm(&mut g, 0.0);
        assert_eq!(g[0], vec![30.0, 40.0], "0 turns clipping off");
    }

    #[test]
    fn rng_is_reproducible() {
        let mut a = Rng::from_parts(&[1, 2]);
        let mut b = Rng::from_parts(&[1, 2]);
        let mut c = Rng::from_parts(&[1, 3]);
        let (x, y, z) = (a.next_u64(), b.next_u64(), c.next_u64());
        assert_eq!(x, y);
        assert_ne!(x, z);
        let mut v: Vec<u32> = (0..10).collect();
        Rng::new(7).shuffle(&mut v);
        let mut w: Vec<u32> = (0..10).collect();
        Rng::new(7).shuffle(&mut w);
        assert_eq!(v, w);
        assert_ne!(v, (0..10).collect::<Vec<_>>());
    }
}
