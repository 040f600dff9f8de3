//! Rotary position embedding (RoPE) tables and their application.
//!
//! The cos/sin tables cover the model's full context length and are computed
//! once at load time. Two pairings of the head dimension exist:
//! - [`RopeLayout::Interleaved`]: dimensions `(2i, 2i+1)` rotate together
//!   (GGML's `rope` and GGUF llama files, whose Q/K rows are permuted for it);
//!   applied with `candle_nn::rotary_emb::rope_i`.
//! - [`RopeLayout::Halves`]: dimensions `(i, i + d/2)` rotate together (the
//!   Hugging Face / NeoX layout of safetensors checkpoints); applied with
//!   `candle_nn::rotary_emb::rope`.
//!
//! Frequencies are `theta^(-2i/d)`, optionally divided by per-frequency
//! factors (GGUF `rope_freqs.weight`, Hugging Face `llama3` and `linear`
//! scaling, see [`inv_freq_llama3`]).

use candle_core::{Device, Result, Tensor};

/// Which head dimensions form a rotating pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    Interleaved,
    Halves,
}

/// Precomputed cos/sin tables, `[max_len, head_dim / 2]` each.
#[derive(Debug, Clone)]
pub(crate) struct Rotary {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
    max_len: usize,
}

/// Plain RoPE inverse frequencies `theta^(-2i/d)` for `i < d/2`.
pub(crate) fn inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// Llama 3.1 frequency scaling (Hugging Face `rope_type: "llama3"`): long
/// wavelengths are divided by `factor`, short ones kept, and the band between
/// is interpolated smoothly.
pub(crate) fn inv_freq_llama3(
    inv_freq: &[f64],
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: usize,
) -> Vec<f64> {
    let old_len = original_max_position_embeddings as f64;
    let low_freq_wavelen = old_len / low_freq_factor;
    let high_freq_wavelen = old_len / high_freq_factor;
    inv_freq
        .iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_freq_wavelen {
                f
            } else if wavelen > low_freq_wavelen {
                f / factor
            } else {
                let smooth =
                    (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// A step's cos and sin rows, `[tokens, 1, head_dim / 2]` each
/// ([`Rotary::rows`]).
pub(crate) struct RopeRows {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Tables for positions `0..max_len` from `head_dim / 2` inverse
    /// frequencies.
    pub(crate) fn new(
        inv_freq: &[f64],
        max_len: usize,
        layout: RopeLayout,
        device: &Device,
    ) -> Result<Self> {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_len * half);
        let mut sin = Vec::with_capacity(max_len * half);
        for pos in 0..max_len {
            for &f in inv_freq {
                let angle = pos as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_len, half), device)?,
            sin: Tensor::from_vec(sin, (max_len, half), device)?,
            layout,
            max_len,
        })
    }

    /// Rotates `x` of shape `[heads, seq, head_dim]` whose tokens sit at
    /// positions `pos..pos+seq` (the model uses [`Rotary::apply_at`]).
    #[cfg(test)]
    pub(crate) fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let seq = x.dim(1)?;
        if pos + seq > self.max_len {
            candle_core::bail!(
                "position {} past the RoPE table of {}",
                pos + seq,
                self.max_len
            )
        }
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let x = x.contiguous()?.unsqueeze(0)?;
        let y = match self.layout {
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeLayout::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        };
        y.squeeze(0)
    }

    /// Rotates `x` of shape `[heads, tokens, head_dim]` whose token `t` sits
    /// at position `positions[t]` (u32, `[tokens]`): the tokens of several
    /// sequences, each at its own offset, in one call.
    pub(crate) fn apply_at(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let cos = self.cos.index_select(positions, 0)?;
        let sin = self.sin.index_select(positions, 0)?;
        let x = x.contiguous()?.unsqueeze(0)?;
        let y = match self.layout {
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeLayout::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        };
        y.squeeze(0)
    }

    /// The cos and sin rows of a step's tokens (`positions`, u32 `[tokens]`),
    /// gathered once for every layer's [`Rotary::apply_rows`].
    pub(crate) fn rows(&self, positions: &Tensor) -> Result<RopeRows> {
        let t = positions.dim(0)?;
        let half = self.cos.dim(1)?;
        let gather = |table: &Tensor| table.index_select(positions, 0)?.reshape((t, 1, half));
        Ok(RopeRows {
            cos: gather(&self.cos)?,
            sin: gather(&self.sin)?,
        })
    }

    /// `rows` as the layer ops' RoPE table.
    pub(crate) fn table<'a>(&'a self, rows: &'a RopeRows) -> crate::layer_ops::Rope<'a> {
        crate::layer_ops::Rope {
            cos: &rows.cos,
            sin: &rows.sin,
            layout: self.layout,
        }
    }

    /// Rotates `x` of shape `[tokens, heads, head_dim]` (token-major, as a
    /// projection's output reshapes to, without a copy), token `t` by row
    /// `t` of `rows`: each token is a batch of its own in candle's rope op,
    /// with its own cos and sin row.
    pub(crate) fn apply_rows(&self, x: &Tensor, rows: &RopeRows) -> Result<Tensor> {
        let (t, h, d) = x.dims3()?;
        let x = x.contiguous()?.reshape((t, h, 1, d))?;
        let y = match self.layout {
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, &rows.cos, &rows.sin)?,
            RopeLayout::Halves => candle_nn::rotary_emb::rope(&x, &rows.cos, &rows.sin)?,
        };
        y.reshape((t, h, d))
    }

    /// The cos and sin tables as `[max_len, head_dim / 2]` f32.
    pub(crate) fn tables(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((
            self.cos.flatten_all()?.to_vec1()?,
            self.sin.flatten_all()?.to_vec1()?,
        ))
    }

    pub(crate) fn layout(&self) -> RopeLayout {
        self.layout
    }

    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position 0 is the identity; adjacent pairs vs halves differ as expected.
    #[test]
    fn layouts_rotate_the_right_pairs() -> Result<()> {
        let dev = Device::Cpu;
        let freqs = inv_freq(4, 10000.0);
        let x = Tensor::new(&[[[1f32, 2., 3., 4.], [1., 2., 3., 4.]]], &dev)?; // [1, 2, 4]
        for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
            let r = Rotary::new(&freqs, 8, layout, &dev)?;
            let y = r.apply(&x, 0)?.to_vec3::<f32>()?;
            assert_eq!(y[0][0], vec![1., 2., 3., 4.]);
            let (c, s) = (1f32.cos(), 1f32.sin()); // pos 1, freq 0 = 1.0
            let y1 = &y[0][1];
            match layout {
                // pair (x0, x1) rotates by angle 1
                RopeLayout::Interleaved => {
                    assert!((y1[0] - (c - 2. * s)).abs() < 1e-5);
                    assert!((y1[1] - (s + 2. * c)).abs() < 1e-5);
                }
                // pair (x0, x2) rotates by angle 1
                RopeLayout::Halves => {
                    assert!((y1[0] - (c - 3. * s)).abs() < 1e-5);
                    assert!((y1[2] - (s + 3. * c)).abs() < 1e-5);
                }
            }
            assert!(r.apply(&x, 7).is_err());
        }
        Ok(())
    }

    /// Token-major rotation with per-token rows gives the same bits as the
    /// head-major one at the same positions, in both layouts.
    #[test]
    fn rows_rotate_tokens_as_apply_at_does() -> Result<()> {
        let dev = Device::Cpu;
        let freqs = inv_freq(8, 10000.0);
        let (t, h, d) = (5, 3, 8);
        let x: Vec<f32> = (0..t * h * d)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x = Tensor::from_vec(x, (t, h, d), &dev)?;
        let positions = Tensor::new(&[9u32, 0, 3, 17, 4], &dev)?;
        for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
            let r = Rotary::new(&freqs, 32, layout, &dev)?;
            let want = r
                .apply_at(&x.transpose(0, 1)?, &positions)?
                .transpose(0, 1)?;
            let got = r.apply_rows(&x, &r.rows(&positions)?)?;
            assert_eq!(got.dims3()?, (t, h, d));
            let (got, want) = (
                got.flatten_all()?.to_vec1::<f32>()?,
                want.flatten_all()?.to_vec1::<f32>()?,
            );
            assert_eq!(got, want, "{layout:?}");
            // A different position changes the rotation.
            let other = r.apply_rows(&x, &r.rows(&Tensor::new(&[9u32, 1, 3, 17, 4], &dev)?)?)?;
            assert_ne!(other.flatten_all()?.to_vec1::<f32>()?, want);
        }
        Ok(())
    }
}
