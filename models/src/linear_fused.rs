//! Projections that read the same input (q, k and v; gate and up) joined
//! into one linear, whose output holds theirs side by side: one quantized
//! matmul (on CUDA: one activation quantization and one kernel) instead of
//! one per projection. Each projection becomes a [`Weight::Part`] of the
//! whole, so the weights are held once; code that runs a part alone still
//! gets its own output (the whole's, narrowed), and merging an adapter
//! into a part replaces it with a weight of its own.
//!
//! Quantized blocks never straddle rows, so joining GGUF weights is joining
//! their bytes, row after row: the whole computes exactly what the parts do.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{Result, Tensor};

use crate::linear::{Linear, Weight};

impl Linear {
    /// `parts` joined, as the parts' new values (views of one whole);
    /// `None` when their weights cannot be joined: biases, different
    /// input widths, formats or kinds, or the CPU's kernel matrices (the
    /// CPU's slice path runs each projection on its own).
    pub(crate) fn fuse(parts: &[&Linear]) -> Result<Option<Vec<Linear>>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let k = first.in_features();
        if parts
            .iter()
            .any(|p| p.bias.is_some() || p.in_features() != k)
        {
            return Ok(None);
        }
        let n: usize = parts.iter().map(|p| p.out_features()).sum();
        let whole = match &first.weight {
            Weight::Quantized(QMatMul::QTensor(q0)) => {
                let mut bytes = Vec::new();
                for p in parts {
                    match &p.weight {
                        Weight::Quantized(QMatMul::QTensor(q)) if q.dtype() == q0.dtype() => {
                            bytes.extend_from_slice(&q.data()?)
                        }
                        _ => return Ok(None),
                    }
                }
                let storage = QStorage::from_data(Cow::Owned(bytes), &q0.device(), q0.dtype())?;
                let q = QTensor::new(storage, (n, k))?;
                // candle's matmul, as the parts' (not the CPU's kernels).
                Linear {
                    weight: Weight::Quantized(QMatMul::from_arc(Arc::new(q))?),
                    bias: None,
                    in_features: k,
                    out_features: n,
                }
            }
            Weight::Dense(w0) => {
                let mut ws = Vec::with_capacity(parts.len());
                for p in parts {
                    match &p.weight {
                        Weight::Dense(w) if w.dtype() == w0.dtype() => ws.push(w),
                        _ => return Ok(None),
                    }
                }
                Linear::dense(Tensor::cat(&ws, 0)?)?
            }
            _ => return Ok(None),
        };
        let whole = Arc::new(whole);
        let mut start = 0;
        Ok(Some(
            parts
                .iter()
                .map(|p| {
                    let part = Linear {
                        weight: Weight::Part {
                            whole: whole.clone(),
                            start,
                        },
                        bias: None,
                        ..(*p).clone()
                    };
                    start += p.out_features();
                    part
                })
                .collect(),
        ))
    }

    /// A part as a linear of its own (its rows of the whole's weights),
    /// anything else as it is.
    pub(crate) fn standalone(&self) -> Result<Linear> {
        let Weight::Part { whole, start } = &self.weight else {
            return Ok(self.clone());
        };
        let (start, n, k) = (*start, self.out_features(), self.in_features());
        let weight = match &whole.weight {
            Weight::Quantized(QMatMul::QTensor(q)) => {
                let row = q.dtype().type_size() * k / q.dtype().block_size();
                let bytes = q.data()?[start * row..(start + n) * row].to_vec();
                let storage = QStorage::from_data(Cow::Owned(bytes), &q.device(), q.dtype())?;
                Weight::Quantized(QMatMul::from_arc(Arc::new(QTensor::new(storage, (n, k))?))?)
            }
            Weight::Dense(w) => Weight::Dense(w.narrow(0, start, n)?.contiguous()?),
            _ => candle_core::bail!("a part of a linear that is neither quantized nor dense"),
        };
        Ok(Linear {
            weight,
            ..self.clone()
        })
    }

    /// The whole that `parts` are, in order and together, the parts of.
    pub(crate) fn whole_of<'a>(parts: &[&'a Linear]) -> Option<&'a Linear> {
        let mut whole: Option<&Arc<Linear>> = None;
        let mut next = 0;
        for p in parts {
            match &p.weight {
                Weight::Part { whole: w, start } if *start == next => {
                    if whole.is_some_and(|first| !Arc::ptr_eq(first, w)) {
                        return None;
                    }
                    whole = Some(w);
                    next += p.out_features();
                }
                _ => return None,
            }
        }
        whole.filter(|w| w.out_features() == next).map(|w| &**w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Module};

    /// A seeded `[n, k]` weight or input, uniform on [-0.5, 0.5).
    fn random(n: usize, k: usize, seed: u64) -> Result<Tensor> {
        crate::test_util::random((n, k), seed, &Device::Cpu)? * 0.25
    }

    /// A linear on candle's quantized matmul (as on a GPU), not the CPU's
    /// kernel matrices.
    fn candle_quantized(w: &Tensor, dtype: GgmlDType) -> Result<Linear> {
        let (n, k) = w.dims2()?;
        Ok(Linear {
            weight: Weight::Quantized(QMatMul::from_arc(Arc::new(QTensor::quantize(w, dtype)?))?),
            bias: None,
            in_features: k,
            out_features: n,
        })
    }

    #[test]
    fn joined_weights_give_each_parts_output() -> Result<()> {
        let k = 256;
        let x = random(3, k, 7)?;
        let ws = [random(64, k, 1)?, random(32, k, 2)?, random(32, k, 3)?];
        for dtype in [Some(GgmlDType::Q4_1), Some(GgmlDType::Q4K), None] {
            let parts: Vec<Linear> = ws
                .iter()
                .map(|w| match dtype {
                    Some(d) => candle_quantized(w, d),
                    None => Linear::dense(w.clone()),
                })
                .collect::<Result<_>>()?;
            let refs: Vec<&Linear> = parts.iter().collect();
            let joined = Linear::fuse(&refs)?.expect("joinable");
            let jrefs: Vec<&Linear> = joined.iter().collect();
            let whole = Linear::whole_of(&jrefs).expect("one whole");
            assert_eq!(whole.out_features(), 128);
            let all = whole.forward(&x)?;
            let mut start = 0;
            for (alone, part) in parts.iter().zip(&joined) {
                let want = alone.forward(&x)?;
                let n = alone.out_features();
                for got in [all.narrow(1, start, n)?, part.forward(&x)?] {
                    let d = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
                    // The same products; f32 matmuls of other widths may
                    // sum in another order.
                    let tol = if dtype.is_some() { 0.0 } else { 1e-5 };
                    assert!(d <= tol, "{dtype:?}: {d}");
                }
                start += n;
            }
            for (alone, part) in parts.iter().zip(&joined) {
                let own = part.standalone()?;
                assert!(!matches!(own.weight, Weight::Part { .. }));
                let d = (own.forward(&x)? - alone.forward(&x)?)?.abs()?.max_all()?;
                assert_eq!(d.to_scalar::<f32>()?, 0.0, "{dtype:?} standalone");
            }
            // Out of order, or a part missing, is not the whole.
            assert!(Linear::whole_of(&[jrefs[1], jrefs[0], jrefs[2]]).is_none());
            assert!(Linear::whole_of(&jrefs[..2]).is_none());
        }
        // Different formats do not join.
        let mixed = [
            candle_quantized(&ws[0], GgmlDType::Q4K)?,
            candle_quantized(&ws[1], GgmlDType::Q6K)?,
        ];
        assert!(Linear::fuse(&[&mixed[0], &mixed[1]])?.is_none());
        Ok(())
    }
}
