//! Folding a LoRA adapter into a model's weights: `W' = W + scale * B A`
//! per adapted projection, so a deployment of one fine-tuned model pays no
//! per-token adapter cost.
//!
//! A `hearth-kernels` matrix is dequantized, the update added in f32, and
//! the sum quantized to Q8_0 (8 bits per 32 values), whatever the base's
//! format: the update of a small fine-tune is far below a 4-bit format's
//! step and would round away, while Q8_0's step keeps it (the merged layer
//! takes twice a Q4 layer's memory). Any other weight becomes a dense f32
//! layer. The adapter must be prepared for the model
//! ([`crate::LoraSpec::prepare`]: GGUF's row order for GGUF bases).

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Result, Tensor};

use crate::linear::{Linear, Weight};
use crate::llama::Llama;
use crate::lora::{LoraAdapter, LoraTarget, LoraWeights};

impl Linear {
    /// The weight as f32 `[out, in]`.
    fn weight_f32(&self) -> Result<Tensor> {
        match &self.weight {
            Weight::Kernel(op) => Tensor::from_vec(
                op.0.dequantize(),
                (self.out_features(), self.in_features()),
                &Device::Cpu,
            ),
            Weight::Dense(w) => w.to_dtype(DType::F32),
            Weight::Part { whole, start } => {
                whole.weight_f32()?.narrow(0, *start, self.out_features())
            }
            Weight::Quantized(QMatMul::QTensor(q)) => q.dequantize(&q.device()),
            Weight::Quantized(QMatMul::Tensor(w)) | Weight::Quantized(QMatMul::TensorF16(w)) => {
                w.to_dtype(DType::F32)
            }
        }
    }

    /// This layer with `scale * B A` added to its weight (bias kept).
    pub(crate) fn merged(&self, lora: &LoraWeights, scale: f64) -> Result<Linear> {
        let (n, k) = (self.out_features(), self.in_features());
        let w = self.weight_f32()?;
        let delta = (lora
            .b
            .to_dtype(DType::F32)?
            .matmul(&lora.a.to_dtype(DType::F32)?)?
            * scale)?;
        if delta.dims2()? != (n, k) {
            candle_core::bail!("a LoRA update of {:?} for a {n}x{k} layer", delta.dims())
        }
        let sum = (w + delta.to_device(&self.device())?)?;
        let mut out = match &self.weight {
            Weight::Kernel(_) if k % 32 == 0 => {
                let values = sum.flatten_all()?.to_vec1::<f32>()?;
                let m = hearth_kernels::QuantMatrix::from_f32_q8_0(&values, n, k)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                Linear::from_kernel(m)
            }
            _ => Linear::dense(sum)?,
        };
        if let Some(bias) = &self.bias {
            out = out.with_bias(bias.clone())?;
        }
        Ok(out)
    }

    pub(crate) fn device(&self) -> Device {
        match &self.weight {
            Weight::Kernel(_) => Device::Cpu,
            Weight::Dense(w) => w.device().clone(),
            Weight::Part { whole, .. } => whole.device(),
            Weight::Quantized(QMatMul::QTensor(q)) => q.device(),
            Weight::Quantized(QMatMul::Tensor(w)) | Weight::Quantized(QMatMul::TensorF16(w)) => {
                w.device().clone()
            }
        }
    }
}

impl Llama {
    /// Folds `adapter` (prepared for this model) into the weights.
    pub fn merge_lora(&mut self, adapter: &LoraAdapter) -> Result<()> {
        if adapter.num_layers() != self.blocks.len() {
            candle_core::bail!(
                "an adapter of {} layers for a model of {}",
                adapter.num_layers(),
                self.blocks.len()
            )
        }
        let scale = adapter.config.scale();
        for (block, layer) in self.blocks.iter_mut().zip(&adapter.layers) {
            // Joined projections (a GPU's) come apart first: a merged part
            // gets weights of its own, and the rest must not keep running
            // the whole product for their share of it.
            let (a, m) = (&mut block.attn, &mut block.mlp);
            for lin in [&mut a.q, &mut a.k, &mut a.v, &mut m.gate, &mut m.up] {
                *lin = lin.standalone()?;
            }
            for (target, lora) in layer {
                let lin = match target {
                    LoraTarget::Q => &mut block.attn.q,
                    LoraTarget::K => &mut block.attn.k,
                    LoraTarget::V => &mut block.attn.v,
                    LoraTarget::O => &mut block.attn.o,
                    LoraTarget::Gate => &mut block.mlp.gate,
                    LoraTarget::Up => &mut block.mlp.up,
                    LoraTarget::Down => &mut block.mlp.down,
                };
                *lin = lin.merged(lora, scale)?;
            }
        }
        self.rejoin_projections()?;
        self.rebuild_cpu_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};

    #[test]
    fn q8_requantization_of_a_q4_layer_is_close() -> Result<()> {
        let (n, k) = (64, 128);
        let v: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let t = Tensor::from_vec(v, (n, k), &Device::Cpu)?;
        let lin = Linear::from_qtensor(QTensor::quantize(&t, GgmlDType::Q4_0)?)?;
        assert!(lin.kernel().is_some());
        let w = lin.weight_f32()?;
        let zero = LoraWeights::new(
            Tensor::zeros((4, k), DType::F32, &Device::Cpu)?,
            Tensor::zeros((n, 4), DType::F32, &Device::Cpu)?,
        );
        let m = lin.merged(&zero, 1.0)?;
        let w2 = m.weight_f32()?;
        let d = (w - w2)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(d < 1.0 / 254.0 + 1e-3, "{d}");
        Ok(())
    }
}
