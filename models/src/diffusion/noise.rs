//! Seeded standard-normal noise drawn on the CPU, so that a seed gives the
//! same latents and ancestral noise on every run and device (candle's device
//! RNGs cannot be seeded on the CPU).

/// SplitMix64 stream with Box-Muller pairs.
pub(crate) struct Gaussian {
    state: u64,
    spare: Option<f32>,
}

impl Gaussian {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5EED_D1FF_u64.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    pub(crate) fn normal(&mut self) -> f32 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let r = (-2.0 * self.uniform().ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.uniform();
        self.spare = Some((r * theta.sin()) as f32);
        (r * theta.cos()) as f32
    }

    pub(crate) fn normals(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.normal()).collect()
    }
}
