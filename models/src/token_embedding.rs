//! The token embedding table of a causal model.
//!
//! A GGUF table is quantized (Q8_0 in the default chat model). Widening the
//! whole table to f16 at load, as a plain tensor, costs `vocab x hidden x 2`
//! bytes (54 MiB for SmolLM2-135M, more than half its weights) to look up a
//! handful of rows per step. On the CPU the table instead stays in its
//! blocks, as a `hearth-kernels` matrix (shared with the output head when
//! the two are tied), and each looked-up row is dequantized to f32 as
//! llama.cpp's `get_rows` does it: `d q (+ m)` with the block's f16 scale.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use hearth_kernels::QuantMatrix;

use crate::linear::kernel_format;

/// `[vocab, hidden]`, looked up by token id into f32 rows.
pub(crate) enum TokenEmbedding {
    /// Any float dtype; looked-up rows are cast to f32.
    Dense(Tensor),
    /// Quantized blocks, dequantized row by row (CPU).
    Blocks(Arc<QuantMatrix>),
}

impl TokenEmbedding {
    /// From a GGUF table: its blocks on the CPU where `hearth-kernels` has
    /// its format, else dequantized (to f16, or kept f32).
    ///
    /// `head` is the output head's matrix when the head is tied to this
    /// table and runs on those same blocks: then they are shared.
    pub(crate) fn from_qtensor(t: &QTensor, head: Option<&Arc<QuantMatrix>>) -> Result<Self> {
        let (n, k) = t.shape().dims2()?;
        if let Some(head) = head {
            return Ok(Self::Blocks(head.clone()));
        }
        if t.device().is_cpu() {
            if let Some(format) = kernel_format(t.dtype()).filter(|f| k % f.block_values() == 0) {
                let m = QuantMatrix::new(format, &t.data()?, n, k)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                return Ok(Self::Blocks(Arc::new(m)));
            }
        }
        Ok(Self::Dense(match t.dtype() {
            GgmlDType::F32 => t.dequantize(&t.device())?,
            _ => t.dequantize_f16(&t.device())?,
        }))
    }

    pub(crate) fn device(&self) -> Device {
        match self {
            Self::Dense(t) => t.device().clone(),
            Self::Blocks(_) => Device::Cpu,
        }
    }

    /// `(vocab, hidden)`.
    pub(crate) fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense(t) => t.dims2(),
            Self::Blocks(m) => Ok((m.n(), m.k())),
        }
    }

    /// The rows of `ids`, `[ids, hidden]` f32 on `device`.
    pub(crate) fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Self::Dense(t) => t
                .index_select(&Tensor::new(ids, device)?, 0)?
                .to_dtype(DType::F32),
            Self::Blocks(m) => {
                let mut rows = Vec::with_capacity(ids.len() * m.k());
                for &id in ids {
                    if id as usize >= m.n() {
                        candle_core::bail!("token id {id} is outside the vocabulary of {}", m.n())
                    }
                    m.dequantize_row(id as usize, &mut rows);
                }
                Tensor::from_vec(rows, (ids.len(), m.k()), device)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;

    use super::*;

    fn table(dtype: GgmlDType) -> Result<(QTensor, Tensor)> {
        let w = Tensor::randn(0f32, 1.0, (40, 64), &Device::Cpu)?;
        let q = QTensor::quantize(&w, dtype)?;
        let plain = q.dequantize(&Device::Cpu)?;
        Ok((q, plain))
    }

    #[test]
    fn block_rows_are_the_dequantized_rows() -> Result<()> {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1, GgmlDType::Q4_0] {
            let (q, plain) = table(dtype)?;
            let e = TokenEmbedding::from_qtensor(&q, None)?;
            assert!(matches!(e, TokenEmbedding::Blocks(_)), "{dtype:?}");
            assert_eq!(e.dims()?, (40, 64));
            let ids = [39u32, 0, 7, 7, 12];
            let got = e.lookup(&ids, &Device::Cpu)?.to_vec2::<f32>()?;
            let idx = Tensor::new(&ids[..], &Device::Cpu)?;
            let want = plain.index_select(&idx, 0)?.to_vec2::<f32>()?;
            assert_eq!(got, want, "{dtype:?}");
        }
        Ok(())
    }

    #[test]
    fn ids_past_the_vocabulary_are_errors() -> Result<()> {
        let (q, _) = table(GgmlDType::Q8_0)?;
        let e = TokenEmbedding::from_qtensor(&q, None)?;
        let err = e.lookup(&[3, 40], &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("token id 40"), "{err}");
        Ok(())
    }

    #[test]
    fn float_tables_stay_tensors() -> Result<()> {
        let (_, plain) = table(GgmlDType::Q8_0)?;
        let f16 = QTensor::quantize(&plain, GgmlDType::F16)?;
        let e = TokenEmbedding::from_qtensor(&f16, None)?;
        assert!(matches!(e, TokenEmbedding::Dense(_)));
        let got = e.lookup(&[5], &Device::Cpu)?.to_vec2::<f32>()?;
        let want = f16
            .dequantize(&Device::Cpu)?
            .narrow(0, 5, 1)?
            .to_vec2::<f32>()?;
        assert_eq!(got, want);
        Ok(())
    }
}
