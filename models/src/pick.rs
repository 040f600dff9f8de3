//! Each row's next token picked where the logits are, so that a GPU step
//! copies back ids instead of a vocabulary of logits per sequence: the
//! argmax (greedy rows) or, for plain temperature sampling, a draw from
//! `softmax(logits / temperature)` by the Gumbel-max trick: the argmax of
//! `logits / T + G` with `G` standard Gumbel noise per token is distributed
//! exactly as the softmax. The noise is a hash of the row's seed and the
//! token id, so the CPU version here and the CUDA kernel (`pick.cu`) give
//! the same ids from the same seeds. NaN logits never win; ties go to the
//! lower id (as the engine's CPU sampler's argmax).

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, D};

/// How one row picks its token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// The largest logit.
    Argmax,
    /// A draw at this temperature (> 0) with this seed.
    Draw { temperature: f32, seed: u64 },
}

/// The token of each row of `logits` (`[rows, vocab]`, any float dtype),
/// one [`Pick`] per row.
pub fn pick_tokens(logits: &Tensor, picks: &[Pick]) -> Result<Vec<u32>> {
    let (rows, _) = logits.dims2()?;
    if rows != picks.len() {
        candle_core::bail!("pick: {} picks for {rows} rows", picks.len())
    }
    let mut params = Vec::with_capacity(3 * rows);
    for p in picks {
        let (seed, inv) = match *p {
            Pick::Argmax => (0, 0.0f32),
            Pick::Draw { temperature, seed } if temperature > 0.0 => (seed, 1.0 / temperature),
            Pick::Draw { temperature, .. } => {
                candle_core::bail!("pick: temperature {temperature} is not positive")
            }
        };
        params.extend([seed as u32, (seed >> 32) as u32, inv.to_bits()]);
    }
    let device = logits.device();
    if !device.is_cpu() && !device.is_cuda() {
        // No kernel here (Metal): candle's argmax, or the CPU version on the
        // logits brought back.
        if picks.iter().all(|p| *p == Pick::Argmax) {
            return logits.argmax(D::Minus1)?.to_vec1::<u32>();
        }
        return pick_tokens(&logits.to_device(&Device::Cpu)?, picks);
    }
    let params = Tensor::new(params.as_slice(), device)?;
    let logits = logits.to_dtype(DType::F32)?.contiguous()?;
    logits
        .apply_op1_no_bwd(&PickOp { params: &params })?
        .to_vec1::<u32>()
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Standard Gumbel noise for token `id` of a row seeded `seed`.
fn gumbel(seed: u64, id: u32) -> f32 {
    let h = mix(seed ^ (id as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let u = ((h >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0);
    -(-u.ln()).ln()
}

struct PickOp<'a> {
    /// Per row: seed low and high halves, the inverse temperature's bits
    /// (0: argmax).
    params: &'a Tensor,
}

impl PickOp<'_> {
    fn shape(&self, l: &Layout) -> Result<(usize, usize)> {
        let (rows, vocab) = match l.dims() {
            [r, v] if l.is_contiguous() => (*r, *v),
            d => candle_core::bail!("pick: logits {d:?}, want contiguous [rows, vocab]"),
        };
        if self.params.elem_count() != 3 * rows || vocab == 0 {
            candle_core::bail!("pick: parameters for {rows} rows of {vocab}")
        }
        Ok((rows, vocab))
    }
}

impl CustomOp1 for PickOp<'_> {
    fn name(&self) -> &'static str {
        "pick-tokens"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = self.shape(l)?;
        let logits = &s.as_slice::<f32>()?[l.start_offset()..];
        let params = self.params.to_vec1::<u32>()?;
        let ids = (0..rows)
            .map(|r| {
                let seed = params[3 * r] as u64 | (params[3 * r + 1] as u64) << 32;
                let inv = f32::from_bits(params[3 * r + 2]);
                let (mut best, mut best_v) = (0u32, f32::NEG_INFINITY);
                for (i, &x) in logits[r * vocab..][..vocab].iter().enumerate() {
                    if x.is_nan() {
                        continue;
                    }
                    let v = if inv == 0.0 {
                        x
                    } else {
                        x * inv + gumbel(seed, i as u32)
                    };
                    if v > best_v {
                        (best, best_v) = (i as u32, v);
                    }
                }
                best
            })
            .collect();
        Ok((CpuStorage::U32(ids), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::WrapErr;
        const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/pick.ptx"));
        let (rows, vocab) = self.shape(l)?;
        let dev = s.device().clone();
        let logits = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        let table = crate::cuda_table::table(self.params, "pick: parameters");
        let params = table.view::<u32>()?;
        // SAFETY: the kernel writes every row's id.
        let out = unsafe { dev.alloc::<u32>(rows)? };
        let func = dev.get_or_load_custom_func("hearth_pick", "hearth_pick", PTX)?;
        let vocab = i32::try_from(vocab).map_err(candle_core::Error::wrap)?;
        let mut b = func.builder();
        b.arg(&logits);
        b.arg(&params);
        b.arg(&out);
        b.arg(&vocab);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as the kernel declares them; `shape` checked
        // the logits' and the parameters' sizes.
        unsafe { b.launch(cfg) }.w()?;
        Ok((
            candle_core::CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from(rows),
        ))
    }
}

#[cfg(test)]
mod tests;
