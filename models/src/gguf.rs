//! Reading a llama GGUF file (as written by llama.cpp's converters) into a
//! [`Llama`].
//!
//! Metadata keys (prefix `llama.`): `context_length`, `embedding_length`,
//! `block_count`, `feed_forward_length` (checked against the tensors),
//! `attention.head_count`, `attention.head_count_kv`, `attention.key_length`,
//! `attention.layer_norm_rms_epsilon`, `rope.dimension_count`,
//! `rope.freq_base`, `rope.scaling.type` / `rope.scaling.factor` (linear).
//!
//! Tensors: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//! attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`,
//! optional `output` (otherwise the head is tied to `token_embd`), optional
//! `rope_freqs` (per-frequency divisors, Llama 3.1 style) and optional
//! `attn_{q,k,v,output}.bias`.
//!
//! Matrices stay quantized (see [`Linear`]: `hearth-kernels` on the CPU for
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, candle's `QMatMul`
//! otherwise). The token
//! embedding stays in its blocks on the CPU, each looked-up row dequantized
//! (shared with a tied head; see `token_embedding.rs`). A head stored as
//! F16/BF16 (tied or not) is quantized to Q8_0 at load on the CPU by
//! default ([`Llama::from_gguf_with`]), as the `[vocab, hidden]` head matmul
//! is the largest of a decode step; an F32 head (test models) stays exact.
//! GGUF Q/K rows are permuted for GGML's adjacent-pair rotary, so the model
//! uses [`RopeLayout::Interleaved`].

use std::io::{Read, Seek};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Tensor};

use crate::linear::{kernel_format, Linear};
use crate::llama::Llama;
use crate::llama_layers::{Attention, Block, Mlp, RmsNorm};
use crate::lora_apply::LoraSpec;
use crate::rotary::{inv_freq, RopeLayout, Rotary};
use crate::token_embedding::TokenEmbedding;
use crate::ModelInfo;

/// Integer metadata of any width.
fn md_usize(c: &Content, key: &str) -> Result<Option<usize>> {
    let v = match c.metadata.get(key) {
        None => return Ok(None),
        Some(v) => v,
    };
    let n: i128 = match v {
        Value::U8(x) => *x as i128,
        Value::I8(x) => *x as i128,
        Value::U16(x) => *x as i128,
        Value::I16(x) => *x as i128,
        Value::U32(x) => *x as i128,
        Value::I32(x) => *x as i128,
        Value::U64(x) => *x as i128,
        Value::I64(x) => *x as i128,
        other => candle_core::bail!("gguf metadata {key} is not an integer: {other:?}"),
    };
    usize::try_from(n)
        .map(Some)
        .map_err(|_| candle_core::Error::Msg(format!("gguf metadata {key} out of range: {n}")))
}

fn md_usize_req(c: &Content, key: &str) -> Result<usize> {
    md_usize(c, key)?.ok_or_else(|| candle_core::Error::Msg(format!("gguf metadata {key} missing")))
}

fn md_f64(c: &Content, key: &str) -> Result<Option<f64>> {
    match c.metadata.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(*x as f64)),
        Some(Value::F64(x)) => Ok(Some(*x)),
        Some(other) => candle_core::bail!("gguf metadata {key} is not a float: {other:?}"),
    }
}

fn md_str<'a>(c: &'a Content, key: &str) -> Result<Option<&'a str>> {
    match c.metadata.get(key) {
        None => Ok(None),
        Some(v) => Ok(Some(v.to_string()?.as_str())),
    }
}

/// The file's architecture, which must be `llama` (the default when unset).
fn llama_arch(c: &Content) -> Result<&str> {
    let arch = md_str(c, "general.architecture")?.unwrap_or("llama");
    if arch != "llama" {
        candle_core::bail!("gguf architecture {arch:?} is not supported by the llama loader")
    }
    Ok(arch)
}

/// The shapes a LoRA adapter must fit to run on the llama GGUF `content`,
/// from its metadata and tensor table alone (no weights read): the
/// [`LoraSpec`] the loaded model's [`crate::CausalLM::lora_spec`] gives on
/// the CPU. For checking an adapter against a base without loading it.
pub fn lora_spec_from_gguf(content: &Content) -> Result<LoraSpec> {
    let c = content;
    let arch = llama_arch(c)?;
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = md_usize_req(c, &key("embedding_length"))?;
    let num_heads = md_usize_req(c, &key("attention.head_count"))?;
    let rows = |name: &str| -> Result<usize> {
        match c.tensor_infos.get(name) {
            Some(t) => Ok(t.shape.dims2()?.0),
            None => candle_core::bail!("gguf tensor {name} missing"),
        }
    };
    let intermediate_size = match md_usize(c, &key("feed_forward_length"))? {
        Some(ff) => ff,
        None => rows("blk.0.ffn_gate.weight")?,
    };
    let info = ModelInfo {
        architecture: arch.to_string(),
        vocab_size: rows("token_embd.weight")?,
        context_length: md_usize_req(c, &key("context_length"))?,
        num_layers: md_usize_req(c, &key("block_count"))?,
        hidden_size: hidden,
        num_heads,
        num_kv_heads: md_usize(c, &key("attention.head_count_kv"))?.unwrap_or(num_heads),
        head_dim: md_usize(c, &key("attention.key_length"))?.unwrap_or(hidden / num_heads.max(1)),
    };
    Ok(LoraSpec {
        info,
        intermediate_size,
        gguf_layout: true,
        device: Device::Cpu,
    })
}

impl Llama {
    /// From a GGUF file already parsed by candle
    /// (`candle_core::quantized::gguf_file::Content::read`); `reader` is the
    /// same file.
    pub fn from_gguf<R: Read + Seek>(
        content: &Content,
        reader: &mut R,
        device: &Device,
    ) -> Result<Self> {
        Self::from_gguf_with(content, reader, device, true)
    }

    /// [`Llama::from_gguf`], choosing whether an F16/BF16 output head is
    /// quantized to Q8_0 on the CPU (`q8_head`; `from_gguf` says yes). This
    /// rounds each head weight to 8 bits per 32 values and makes the head
    /// matmul several times cheaper.
    pub fn from_gguf_with<R: Read + Seek>(
        content: &Content,
        reader: &mut R,
        device: &Device,
        q8_head: bool,
    ) -> Result<Self> {
        let c = content;
        let arch = llama_arch(c)?;
        let key = |k: &str| format!("{arch}.{k}");
        let hidden = md_usize_req(c, &key("embedding_length"))?;
        let num_layers = md_usize_req(c, &key("block_count"))?;
        let num_heads = md_usize_req(c, &key("attention.head_count"))?;
        let num_kv_heads = md_usize(c, &key("attention.head_count_kv"))?.unwrap_or(num_heads);
        let context_length = md_usize_req(c, &key("context_length"))?;
        let head_dim =
            md_usize(c, &key("attention.key_length"))?.unwrap_or(hidden / num_heads.max(1));
        let rope_dim = md_usize(c, &key("rope.dimension_count"))?.unwrap_or(head_dim);
        if rope_dim != head_dim {
            candle_core::bail!(
                "partial rotary (rope dim {rope_dim}, head dim {head_dim}) is not supported"
            )
        }
        let freq_base = md_f64(c, &key("rope.freq_base"))?.unwrap_or(10000.0);
        let eps = md_f64(c, &key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);

        let mut ld = Loader { c, reader, device };

        // Rotary frequencies, with optional linear scaling and rope_freqs divisors.
        let mut freqs = inv_freq(head_dim, freq_base);
        match md_str(c, &key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("linear") => {
                let factor = md_f64(c, &key("rope.scaling.factor"))?.unwrap_or(1.0);
                freqs.iter_mut().for_each(|f| *f /= factor);
            }
            Some(other) => candle_core::bail!("unsupported gguf rope scaling {other:?}"),
        }
        if ld.has("rope_freqs.weight") {
            let factors = ld.f32_vector("rope_freqs.weight")?.to_vec1::<f32>()?;
            if factors.len() != freqs.len() {
                candle_core::bail!(
                    "rope_freqs has {} entries, expected {}",
                    factors.len(),
                    freqs.len()
                )
            }
            freqs
                .iter_mut()
                .zip(&factors)
                .for_each(|(f, d)| *f /= *d as f64);
        }
        let rotary = Rotary::new(&freqs, context_length, RopeLayout::Interleaved, device)?;

        let token_embd = Arc::new(ld.qtensor("token_embd.weight")?);
        let (vocab_size, embd_hidden) = token_embd.shape().dims2()?;
        if embd_hidden != hidden {
            candle_core::bail!(
                "token_embd width {embd_hidden} differs from embedding_length {hidden}"
            )
        }
        let tied = !ld.has("output.weight");
        let lm_head = if tied {
            head_linear(token_embd.clone(), q8_head)?
        } else {
            let head = Arc::new(ld.qtensor("output.weight")?);
            let lin = head_linear(head, q8_head)?;
            if ld.has("output.bias") {
                lin.with_bias(ld.f32_vector("output.bias")?)?
            } else {
                lin
            }
        };
        // A tied head on the table's own blocks (not re-quantized) serves
        // the lookups too.
        let shared = lm_head
            .kernel()
            .filter(|m| tied && kernel_format(token_embd.dtype()) == Some(m.format()));
        let embed = TokenEmbedding::from_qtensor(&token_embd, shared)?;

        let output_norm = RmsNorm::new(ld.f32_vector("output_norm.weight")?, eps)?;
        let mut blocks = Vec::with_capacity(num_layers);
        for i in 0..num_layers {
            let p = format!("blk.{i}");
            blocks.push(Block {
                attn_norm: RmsNorm::new(ld.f32_vector(&format!("{p}.attn_norm.weight"))?, eps)?,
                ffn_norm: RmsNorm::new(ld.f32_vector(&format!("{p}.ffn_norm.weight"))?, eps)?,
                attn: Attention {
                    q: ld.linear(&format!("{p}.attn_q"))?,
                    k: ld.linear(&format!("{p}.attn_k"))?,
                    v: ld.linear(&format!("{p}.attn_v"))?,
                    o: ld.linear(&format!("{p}.attn_output"))?,
                },
                mlp: Mlp {
                    gate: ld.linear(&format!("{p}.ffn_gate"))?,
                    up: ld.linear(&format!("{p}.ffn_up"))?,
                    down: ld.linear(&format!("{p}.ffn_down"))?,
                },
            });
            let a = &blocks[i].attn;
            if a.q.out_features() != num_heads * head_dim
                || a.k.out_features() != num_kv_heads * head_dim
            {
                candle_core::bail!("blk.{i} attention shapes do not match the head counts")
            }
        }
        if let Some(ff) = md_usize(c, &key("feed_forward_length"))? {
            if blocks
                .first()
                .is_some_and(|b| b.mlp.gate.out_features() != ff)
            {
                candle_core::bail!("ffn_gate width differs from feed_forward_length {ff}")
            }
        }

        let info = ModelInfo {
            architecture: arch.to_string(),
            vocab_size,
            context_length,
            num_layers,
            hidden_size: hidden,
            num_heads,
            num_kv_heads,
            head_dim,
        };
        Llama::from_parts(info, embed, blocks, output_norm, lm_head, rotary)
    }
}

/// The output head over `w` (`[vocab, hidden]`): F16/BF16 on the CPU is
/// quantized to Q8_0 for `hearth-kernels` when `q8_head`, else as
/// [`Linear::from_arc`].
fn head_linear(w: Arc<QTensor>, q8_head: bool) -> Result<Linear> {
    let (n, k) = w.shape().dims2()?;
    let half = matches!(w.dtype(), GgmlDType::F16 | GgmlDType::BF16);
    if q8_head && half && w.device().is_cpu() && k % 32 == 0 {
        let f = w
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let m = hearth_kernels::QuantMatrix::from_f32_q8_0(&f, n, k)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        return Ok(Linear::from_kernel(m));
    }
    Linear::from_arc(w)
}

/// Reads tensors of one GGUF file onto a device.
struct Loader<'a, R> {
    c: &'a Content,
    reader: &'a mut R,
    device: &'a Device,
}

impl<R: Read + Seek> Loader<'_, R> {
    fn has(&self, name: &str) -> bool {
        self.c.tensor_infos.contains_key(name)
    }

    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        self.c.tensor(self.reader, name, self.device)
    }

    /// A small tensor (norm scale, bias) as plain f32.
    fn f32_vector(&mut self, name: &str) -> Result<Tensor> {
        self.qtensor(name)?
            .dequantize(self.device)?
            .to_dtype(DType::F32)
    }

    /// `{prefix}.weight` as a (quantized) linear, plus `{prefix}.bias` if present.
    fn linear(&mut self, prefix: &str) -> Result<Linear> {
        let lin = Linear::from_qtensor(self.qtensor(&format!("{prefix}.weight"))?)?;
        let bias = format!("{prefix}.bias");
        if self.has(&bias) {
            lin.with_bias(self.f32_vector(&bias)?)
        } else {
            Ok(lin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Module;

    /// An F16 head becomes a Q8_0 kernel matrix when asked (and stays
    /// candle's otherwise); its logits are within the two 8-bit roundings of
    /// f64 math on the f16 weights: with steps `sw`, `sx` (`max|block| /
    /// 127`), weights move by at most `0.57 sw` and activations by `0.5625
    /// sx` (both scales stored as f16), so each product by at most `0.57 (sw
    /// |x| + sx |w|) + 0.33 sw sx`.
    #[test]
    fn f16_head_is_quantized_to_q8_0() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k) = (300, 64);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let x = Tensor::randn(0f32, 1.0, (2, k), &dev)?;
        let q = || QTensor::quantize(&w, GgmlDType::F16);
        let head = head_linear(Arc::new(q()?), true)?;
        assert!(head.is_quantized());
        assert!(!head_linear(Arc::new(q()?), false)?.is_quantized());
        let got = head.forward(&x)?.to_vec2::<f32>()?;
        let w16 = q()?.dequantize(&dev)?;
        let (ws, xs) = (w16.to_vec2::<f32>()?, x.to_vec2::<f32>()?);
        let step = |v: &[f32]| v.iter().fold(0f32, |a, x| a.max(x.abs())) / 127.0;
        for (r, xr) in xs.iter().enumerate() {
            for (o, wr) in ws.iter().enumerate() {
                let want: f64 = wr.iter().zip(xr).map(|(w, x)| (w * x) as f64).sum();
                let mut bound = 1e-4f32;
                for (wb, xb) in wr.chunks(32).zip(xr.chunks(32)) {
                    let (sw, sx) = (step(wb), step(xb));
                    bound += wb
                        .iter()
                        .zip(xb)
                        .map(|(w, x)| 0.57 * (sw * x.abs() + sx * w.abs()) + 0.33 * sw * sx)
                        .sum::<f32>();
                }
                let d = (got[r][o] as f64 - want).abs() as f32;
                assert!(d <= bound, "row {r} out {o}: |diff| {d} > {bound}");
            }
        }
        Ok(())
    }
}
