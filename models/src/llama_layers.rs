//! A Llama block's parts: the RMS norm, the attention projections and the
//! SwiGLU feed-forward, with q/k/v and gate/up run as one product when
//! their weights are joined (`linear_fused.rs`).

use candle_core::{DType, Device, Module, Result, Tensor, D};

use crate::linear::Linear;
use crate::lora::LoraTarget;
use crate::lora_apply::LoraBatch;

/// Root-mean-square layer norm with an f32 scale.
#[derive(Debug, Clone)]
pub(crate) struct RmsNorm {
    pub(crate) weight: Tensor,
    pub(crate) eps: f32,
}

impl RmsNorm {
    pub(crate) fn new(weight: Tensor, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: weight.to_dtype(DType::F32)?,
            eps: eps as f32,
        })
    }

    pub(crate) fn weight_f32(&self) -> Result<Vec<f32>> {
        self.weight.to_device(&Device::Cpu)?.to_vec1()
    }

    pub(crate) fn eps(&self) -> f32 {
        self.eps
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}

/// Grouped-query self-attention of one block.
pub(crate) struct Attention {
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
pub(crate) struct Mlp {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Attention {
    /// The q, k and v projections of `x` (`[tokens, hidden]`): views of one
    /// product when their weights are joined (`linear_fused.rs`).
    pub(crate) fn qkv(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        let Some(all) = Linear::whole_of(&[&self.q, &self.k, &self.v]) else {
            return Ok([self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?]);
        };
        let y = all.forward(x)?;
        let (nq, nk, nv) = (
            self.q.out_features(),
            self.k.out_features(),
            self.v.out_features(),
        );
        Ok([
            y.narrow(D::Minus1, 0, nq)?,
            y.narrow(D::Minus1, nq, nk)?,
            y.narrow(D::Minus1, nq + nk, nv)?,
        ])
    }
}

impl Mlp {
    /// The gate and up projections of `x` in block `layer`, with the
    /// batch's adapters; one product when their weights are joined, as
    /// [`Attention::qkv`].
    pub(crate) fn gate_up(
        &self,
        layer: usize,
        x: &Tensor,
        lora: &LoraBatch<'_>,
    ) -> Result<[Tensor; 2]> {
        let [g, u] = match Linear::whole_of(&[&self.gate, &self.up]) {
            Some(all) => {
                let y = all.forward(x)?;
                let n = self.gate.out_features();
                [
                    y.narrow(D::Minus1, 0, n)?,
                    y.narrow(D::Minus1, n, self.up.out_features())?,
                ]
            }
            None => [self.gate.forward(x)?, self.up.forward(x)?],
        };
        Ok([
            lora.apply(layer, LoraTarget::Gate, x, g)?,
            lora.apply(layer, LoraTarget::Up, x, u)?,
        ])
    }

    /// The down projection of `h` in block `layer`, with the batch's
    /// adapters.
    pub(crate) fn down(&self, layer: usize, h: &Tensor, lora: &LoraBatch<'_>) -> Result<Tensor> {
        lora.apply(layer, LoraTarget::Down, h, self.down.forward(h)?)
    }
}

/// Joins each block's q, k and v weights, and its gate and up weights,
/// where their formats allow (`linear_fused.rs`): one matmul for each
/// group instead of three and two.
pub(crate) fn fuse_projections(blocks: &mut [Block]) -> Result<()> {
    for b in blocks {
        let (a, m) = (&mut b.attn, &mut b.mlp);
        let qkv: Option<[Linear; 3]> =
            Linear::fuse(&[&a.q, &a.k, &a.v])?.and_then(|p| p.try_into().ok());
        if let Some([q, k, v]) = qkv {
            (a.q, a.k, a.v) = (q, k, v);
        }
        let gate_up: Option<[Linear; 2]> =
            Linear::fuse(&[&m.gate, &m.up])?.and_then(|p| p.try_into().ok());
        if let Some([g, u]) = gate_up {
            (m.gate, m.up) = (g, u);
        }
    }
    Ok(())
}

/// One pre-norm transformer block.
pub(crate) struct Block {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attn: Attention,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) mlp: Mlp,
}
