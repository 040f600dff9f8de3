//! BERT encoder (and its sequence-classification head) on plain candle ops.
//!
//! - Paper: <https://arxiv.org/abs/1810.04805>; weights and names follow
//!   Hugging Face `BertModel` / `BertForSequenceClassification`
//!   (<https://github.com/huggingface/transformers/blob/main/src/transformers/models/bert/modeling_bert.py>).
//! - Post-LayerNorm blocks, absolute learned positions, exact (erf) GELU,
//!   LayerNorm eps from `config.json`.
//!
//! No padding waste: [`Bert::forward_packed`] takes a batch of sequences of any
//! lengths, concatenates their tokens into one `[total_tokens, hidden]` matrix
//! for every dense layer (embeddings, QKV, output, FFN), and runs attention
//! per sequence on its own rows, so no token ever attends to (or pays for) a
//! padding position (`packed_attention.rs`). The result is packed the same way; [`pool`] turns it into
//! one vector per sequence.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{LayerNorm, VarBuilder};
use serde::Deserialize;

use crate::bert_cpu::{pick_rows, CpuLayer, EncoderPrecision, LayerTensors, Norm, Scratch};
use crate::packed_attention::packed_attention;
use crate::vecmath;
use crate::Linear;

/// The fields of a BERT (or RoBERTa) `config.json` that matter here (others
/// are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
    /// Labels of a classification head; their count sizes the classifier.
    #[serde(default)]
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
    /// The padding token; RoBERTa counts positions from the one after it.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_max_positions() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_position_type() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Outputs of a sequence-classification head (1 when no labels are named).
    pub fn num_labels(&self) -> usize {
        self.id2label.as_ref().map_or(1, |m| m.len().max(1))
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.hidden_act != "gelu" {
            candle_core::bail!(
                "unsupported hidden_act `{}` (only exact gelu)",
                self.hidden_act
            )
        }
        if self.position_embedding_type != "absolute" {
            candle_core::bail!(
                "unsupported position_embedding_type `{}`",
                self.position_embedding_type
            )
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            candle_core::bail!("hidden_size must be a multiple of num_attention_heads")
        }
        Ok(())
    }
}

/// One sequence of a batch: token ids and, for sentence pairs, segment ids.
#[derive(Debug, Clone, Copy)]
pub struct EncoderInput<'a> {
    pub ids: &'a [u32],
    /// `None` means segment 0 everywhere.
    pub type_ids: Option<&'a [u32]>,
}

impl<'a> EncoderInput<'a> {
    pub fn new(ids: &'a [u32]) -> Self {
        Self {
            ids,
            type_ids: None,
        }
    }
}

pub(crate) fn linear(vb: VarBuilder, inp: usize, out: usize) -> Result<Linear> {
    Linear::dense(vb.get((out, inp), "weight")?)?.with_bias(vb.get(out, "bias")?)
}

fn layer_norm(vb: VarBuilder, size: usize, eps: f64) -> Result<LayerNorm> {
    candle_nn::layer_norm(size, eps, vb)
}

struct Layer {
    qkv: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    ffn_in: Linear,
    ffn_out: Linear,
    ffn_norm: LayerNorm,
}

/// The encoder's layers: on candle ops, or on slices (`bert_cpu.rs`: f32 on
/// the CPU).
enum Layers {
    Candle(Vec<Layer>),
    Slices(Vec<CpuLayer>),
}

/// One layer's tensors as stored (Q, K and V stacked into one `[3h, h]`
/// matmul), before they become a [`Layer`] or a [`CpuLayer`].
struct LayerWeights {
    qkv: (Tensor, Tensor),
    attn_out: (Tensor, Tensor),
    attn_norm: (Tensor, Tensor),
    ffn_in: (Tensor, Tensor),
    ffn_out: (Tensor, Tensor),
    ffn_norm: (Tensor, Tensor),
    eps: f64,
}

impl LayerWeights {
    fn load(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let sa = vb.pp("attention.self");
        // Q, K and V stacked, weights `[3h, h]` or biases `[3h]`.
        let qkv = |weights: bool| -> Result<Tensor> {
            let get = |name: &str| match weights {
                true => sa.get((h, h), &format!("{name}.weight")),
                false => sa.get(h, &format!("{name}.bias")),
            };
            Tensor::cat(&[get("query")?, get("key")?, get("value")?], 0)
        };
        let dense = |vb: VarBuilder, inp: usize, out: usize| -> Result<(Tensor, Tensor)> {
            Ok((vb.get((out, inp), "weight")?, vb.get(out, "bias")?))
        };
        let norm = |vb: VarBuilder| -> Result<(Tensor, Tensor)> {
            Ok((vb.get(h, "weight")?, vb.get(h, "bias")?))
        };
        Ok(Self {
            qkv: (qkv(true)?, qkv(false)?),
            attn_out: dense(vb.pp("attention.output.dense"), h, h)?,
            attn_norm: norm(vb.pp("attention.output.LayerNorm"))?,
            ffn_in: dense(vb.pp("intermediate.dense"), h, ff)?,
            ffn_out: dense(vb.pp("output.dense"), ff, h)?,
            ffn_norm: norm(vb.pp("output.LayerNorm"))?,
            eps: cfg.layer_norm_eps,
        })
    }

    fn candle(self) -> Result<Layer> {
        let linear = |(w, b): (Tensor, Tensor)| Linear::dense(w)?.with_bias(b);
        let norm = |(w, b): (Tensor, Tensor)| LayerNorm::new(w, b, self.eps);
        Ok(Layer {
            qkv: linear(self.qkv)?,
            attn_out: linear(self.attn_out)?,
            attn_norm: norm(self.attn_norm),
            ffn_in: linear(self.ffn_in)?,
            ffn_out: linear(self.ffn_out)?,
            ffn_norm: norm(self.ffn_norm),
        })
    }

    fn slices(&self) -> Result<CpuLayer> {
        CpuLayer::new(LayerTensors {
            qkv: &self.qkv,
            attn_out: &self.attn_out,
            attn_norm: &self.attn_norm,
            ffn_in: &self.ffn_in,
            ffn_out: &self.ffn_out,
            ffn_norm: &self.ffn_norm,
            eps: self.eps,
        })
    }
}

impl Layer {
    /// `x`: packed `[total, h]`; `lens`: the sequences' lengths, in order.
    fn forward(&self, x: &Tensor, lens: &[usize], heads: usize) -> Result<Tensor> {
        let (_, h) = x.dims2()?;
        let qkv = self.qkv.forward(x)?.flatten_all()?.to_vec1::<f32>()?;
        let ctx = packed_attention(&qkv, h, heads, lens);
        let ctx = Tensor::from_vec(ctx, (lens.iter().sum::<usize>(), h), x.device())?;
        let x = self
            .attn_norm
            .forward(&(self.attn_out.forward(&ctx)? + x)?)?;
        let ff = gelu_erf(&self.ffn_in.forward(&x)?)?;
        self.ffn_norm.forward(&(self.ffn_out.forward(&ff)? + x)?)
    }
}

/// Exact GELU, `x * (1 + erf(x / sqrt 2)) / 2`, for contiguous f32 CPU
/// tensors on slices over the rayon pool with a vectorised `erf` (absolute
/// error below 1e-6; `vecmath.rs`), where candle runs a scalar libm `erf` on
/// one thread; candle's own op otherwise.
fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    use rayon::prelude::*;
    if !x.device().is_cpu() || x.dtype() != DType::F32 || !x.is_contiguous() {
        return x.gelu_erf();
    }
    let mut v = x.flatten_all()?.to_vec1::<f32>()?;
    v.par_chunks_mut(8192).for_each(vecmath::gelu_erf_inplace);
    Tensor::from_vec(v, x.shape(), x.device())
}

/// Where a BERT-family encoder differs from BERT's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The position of a sequence's first token (0 in BERT; RoBERTa starts
    /// after its padding token).
    pub position_offset: usize,
    /// Whether segment (token type) ids are read; when not, every token is
    /// segment 0.
    pub segments: bool,
}

impl Layout {
    pub(crate) const BERT: Layout = Layout {
        position_offset: 0,
        segments: true,
    };
}

/// Largest layer buffers a [`Bert`] keeps between forward passes (a batch
/// of 128 sentences of 24 tokens of MiniLM takes 52 MB; the default
/// 8192-token batches of long inputs 140 MB, given back after each pass).
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

/// A BERT-family encoder (`BertModel` without its pooler; RoBERTa through
/// `roberta.rs`).
pub struct Bert {
    word: WordTable,
    position: Tensor,
    token_type: Tensor,
    embed_norm: LayerNorm,
    /// `embed_norm` on slices, for the slice layers.
    embed_norm_rows: Option<Norm>,
    layers: Layers,
    /// The dense layers' arithmetic in effect (`F32`, `Bf16` or `Int16`).
    precision: EncoderPrecision,
    cfg: BertConfig,
    layout: Layout,
    device: Device,
    /// The slice layers' buffers, kept from one forward pass to the next
    /// (see [`Bert::with_scratch`]).
    scratch: std::sync::Mutex<Scratch>,
}

impl Bert {
    /// Loads the weights under `vb` (the root of a `BertModel` checkpoint, or
    /// its `bert.` prefix for task checkpoints: see [`Bert::load`]).
    pub fn new(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        Self::with_layout(cfg, vb, Layout::BERT)
    }

    pub(crate) fn with_layout(cfg: &BertConfig, vb: VarBuilder, layout: Layout) -> Result<Self> {
        let slices = vb.device().is_cpu() && vb.dtype() == DType::F32;
        Self::build(cfg, vb, layout, slices)
    }

    /// [`Bert::load`] keeping every layer on candle operations (as on a
    /// GPU or with half-precision weights) even where the slice path
    /// (`bert_cpu.rs`) would run: for comparisons.
    pub fn load_candle_ops(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        Self::build(cfg, under(vb, "bert"), Layout::BERT, false)
    }

    fn build(cfg: &BertConfig, vb: VarBuilder, layout: Layout, slices: bool) -> Result<Self> {
        cfg.check()?;
        if cfg.max_position_embeddings <= layout.position_offset {
            candle_core::bail!("max_position_embeddings leaves no position for tokens")
        }
        let h = cfg.hidden_size;
        let e = vb.pp("embeddings");
        let weights = (0..cfg.num_hidden_layers)
            .map(|i| LayerWeights::load(cfg, vb.pp(format!("encoder.layer.{i}"))));
        let layers = if slices {
            Layers::Slices(weights.map(|w| w?.slices()).collect::<Result<_>>()?)
        } else {
            Layers::Candle(weights.map(|w| w?.candle()).collect::<Result<_>>()?)
        };
        let embed_norm = layer_norm(e.pp("LayerNorm"), h, cfg.layer_norm_eps)?;
        let embed_norm_rows = match (&layers, embed_norm.bias()) {
            (Layers::Slices(_), Some(b)) => {
                Some(Norm::new(embed_norm.weight(), b, cfg.layer_norm_eps)?)
            }
            _ => None,
        };
        Ok(Self {
            word: WordTable::Tensor(e.get((cfg.vocab_size, h), "word_embeddings.weight")?),
            position: e.get(
                (cfg.max_position_embeddings, h),
                "position_embeddings.weight",
            )?,
            token_type: e.get((cfg.type_vocab_size, h), "token_type_embeddings.weight")?,
            embed_norm,
            embed_norm_rows,
            layers,
            precision: EncoderPrecision::F32,
            cfg: cfg.clone(),
            layout,
            device: vb.device().clone(),
            scratch: Default::default(),
        })
    }

    /// Runs `f` with the slice layers' buffers of the last forward pass
    /// (fresh ones cost page faults for every pass: on a batch of 128
    /// sentences, 50 MB of them), kept for the next unless they grew past
    /// [`KEEP_SCRATCH_BYTES`]; a pass that finds them in use by another
    /// thread takes fresh ones.
    fn with_scratch<R>(&self, f: impl FnOnce(&mut Scratch) -> R) -> R {
        match self.scratch.try_lock() {
            Ok(mut scratch) => {
                scratch.begin();
                let out = f(&mut scratch);
                if scratch.bytes() > KEEP_SCRATCH_BYTES {
                    *scratch = Scratch::default();
                }
                out
            }
            Err(_) => f(&mut Scratch::default()),
        }
    }

    /// Loads from a checkpoint root, looking under `bert.` when the weights
    /// are stored there (as in `BertForSequenceClassification`).
    pub fn load(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        Self::load_under(cfg, vb, "bert", Layout::BERT)
    }

    /// Loads from `vb` or, when the weights are stored there, from its
    /// `prefix.` (task checkpoints keep the encoder under the model's name).
    pub(crate) fn load_under(
        cfg: &BertConfig,
        vb: VarBuilder,
        prefix: &str,
        layout: Layout,
    ) -> Result<Self> {
        Self::with_layout(cfg, under(vb, prefix), layout)
    }

    /// Runs the dense layers at `precision` from now on (loading gives
    /// f32) and returns what that means here: on CPU slice layers `Auto`
    /// becomes `Bf16` where the CPU has AVX-512 BF16, `Int16` on CPUs with
    /// AVX2 and FMA but no AVX-512, `F32` otherwise
    /// ([`EncoderPrecision::resolve`]); on the candle path always `F32`.
    /// `Bf16` or `Int16` is an error where it cannot run. With `Bf16` the
    /// word-embedding table is kept in f16 as well. Going back to `F32`
    /// keeps the rounded weights and table.
    pub fn set_precision(&mut self, precision: EncoderPrecision) -> Result<EncoderPrecision> {
        let resolved = match &mut self.layers {
            Layers::Slices(layers) => {
                let p = precision.resolve()?;
                for layer in layers {
                    layer.set_precision(p)?;
                }
                if let (EncoderPrecision::Bf16, WordTable::Tensor(t)) = (p, &self.word) {
                    // Half the memory (22 MiB of MiniLM's 45), with 8x less
                    // rounding than the bf16 inputs of the first layer.
                    let values = t.flatten_all()?.to_vec1::<f32>()?;
                    let mut bits = vec![0u16; values.len()];
                    vecmath::f32_to_f16(&values, &mut bits);
                    self.word = WordTable::F16(bits);
                }
                p
            }
            Layers::Candle(_)
                if matches!(precision, EncoderPrecision::Bf16 | EncoderPrecision::Int16) =>
            {
                candle_core::bail!(
                    "{} encoder arithmetic is for f32 weights on the CPU",
                    precision.as_str()
                )
            }
            Layers::Candle(_) => EncoderPrecision::F32,
        };
        self.precision = resolved;
        Ok(resolved)
    }

    /// The dense layers' arithmetic in effect (`F32`, `Bf16` or `Int16`).
    pub fn precision(&self) -> EncoderPrecision {
        self.precision
    }

    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Longest sequence the position table allows.
    pub fn max_positions(&self) -> usize {
        self.cfg.max_position_embeddings - self.layout.position_offset
    }

    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    /// Encodes a batch; returns the last hidden states packed as
    /// `[sum of lengths, hidden]` (f32), sequence after sequence.
    ///
    /// Errors when a sequence is empty or longer than the position table, or
    /// a token or segment id is out of range.
    pub fn forward_packed(&self, batch: &[EncoderInput]) -> Result<Tensor> {
        let heads = self.cfg.num_attention_heads;
        match &self.layers {
            Layers::Candle(layers) => {
                let (x, lens) = self.embed(batch)?;
                layers
                    .iter()
                    .try_fold(x, |x, layer| layer.forward(&x, &lens, heads))
            }
            Layers::Slices(layers) => {
                let (mut v, lens) = self.embed_rows(batch)?;
                self.with_scratch(|scratch| {
                    for layer in layers {
                        layer.forward(&mut v, &lens, heads, scratch);
                    }
                });
                let rows = v.len() / self.cfg.hidden_size;
                Tensor::from_vec(v, (rows, self.cfg.hidden_size), &self.device)
            }
        }
    }

    /// One vector per sequence, `[batch, hidden]`: the last hidden states
    /// [`pool`]ed. When only one token of each sequence is kept (`Cls`,
    /// `LastToken`) and the layers run on slices, the last layer computes
    /// only those rows (its keys and values still come from every token).
    pub fn forward_pooled(&self, batch: &[EncoderInput], pooling: Pooling) -> Result<Tensor> {
        let picks: Option<Vec<usize>> = match pooling {
            Pooling::Mean => None,
            Pooling::Cls => Some(vec![0; batch.len()]),
            Pooling::LastToken => Some(batch.iter().map(|b| b.ids.len().max(1) - 1).collect()),
        };
        let Layers::Slices(layers) = &self.layers else {
            let lens: Vec<usize> = batch.iter().map(|b| b.ids.len()).collect();
            return pool(&self.forward_packed(batch)?, &lens, pooling);
        };
        let (mut v, lens) = self.embed_rows(batch)?;
        let (h, heads) = (self.cfg.hidden_size, self.cfg.num_attention_heads);
        let pooled = self.with_scratch(|scratch| match (picks, layers.split_last()) {
            (Some(picks), Some((last, rest))) => {
                for layer in rest {
                    layer.forward(&mut v, &lens, heads, scratch);
                }
                last.forward_rows(&v, &lens, &picks, heads, scratch)
            }
            (picks, _) => {
                for layer in layers {
                    layer.forward(&mut v, &lens, heads, scratch);
                }
                match picks {
                    Some(picks) => pick_rows(&v, &lens, &picks, h),
                    None => mean_rows(&v, &lens, h),
                }
            }
        });
        Tensor::from_vec(pooled, (lens.len(), h), &self.device)
    }

    /// The embeddings of a checked batch, packed `[total, hidden]` (f32),
    /// and the sequences' lengths.
    fn embed(&self, batch: &[EncoderInput]) -> Result<(Tensor, Vec<usize>)> {
        let (x, lens) = self.embed_sum(batch)?;
        Ok((self.embed_norm.forward(&x)?, lens))
    }

    /// [`Bert::embed`] as rows for the slice layers, normalised on slices.
    fn embed_rows(&self, batch: &[EncoderInput]) -> Result<(Vec<f32>, Vec<usize>)> {
        let (x, lens) = self.embed_sum(batch)?;
        let mut v = x.flatten_all()?.to_vec1::<f32>()?;
        match &self.embed_norm_rows {
            Some(norm) => norm.apply(&mut v),
            None => {
                let normed = self.embed_norm.forward(&x)?;
                v = normed.flatten_all()?.to_vec1::<f32>()?;
            }
        }
        Ok((v, lens))
    }

    /// The summed word, position and segment embeddings of a checked batch
    /// (before the LayerNorm), `[total, hidden]` f32, and the lengths.
    fn embed_sum(&self, batch: &[EncoderInput]) -> Result<(Tensor, Vec<usize>)> {
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut types = Vec::new();
        let mut lens = Vec::with_capacity(batch.len());
        for input in batch {
            let n = input.ids.len();
            if n == 0 || n > self.max_positions() {
                candle_core::bail!(
                    "sequence of {n} tokens (1 to {} allowed)",
                    self.max_positions()
                )
            }
            if let Some(&bad) = input
                .ids
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                candle_core::bail!("token id {bad} is out of the vocabulary")
            }
            match input.type_ids.filter(|_| self.layout.segments) {
                Some(t) if t.len() != n => candle_core::bail!("type ids do not match the ids"),
                Some(t) if t.iter().any(|&x| x as usize >= self.cfg.type_vocab_size) => {
                    candle_core::bail!("segment id out of range")
                }
                Some(t) => types.extend_from_slice(t),
                None => types.extend(std::iter::repeat_n(0u32, n)),
            }
            ids.extend_from_slice(input.ids);
            let first = self.layout.position_offset;
            positions.extend((first..first + n).map(|p| p as u32));
            lens.push(n);
        }
        if lens.is_empty() {
            candle_core::bail!("empty batch")
        }
        let total = ids.len();
        let words = match &self.word {
            WordTable::Tensor(t) => {
                t.index_select(&Tensor::new(ids.as_slice(), &self.device)?, 0)?
            }
            WordTable::F16(bits) => {
                let h = self.cfg.hidden_size;
                let mut rows = vec![0f32; total * h];
                for (row, &id) in rows.chunks_mut(h).zip(&ids) {
                    vecmath::f16_to_f32(&bits[id as usize * h..][..h], row);
                }
                Tensor::from_vec(rows, (total, h), &self.device)?
            }
        };
        let positions = Tensor::from_vec(positions, total, &self.device)?;
        let types = Tensor::from_vec(types, total, &self.device)?;
        let x = (words + self.position.index_select(&positions, 0)?)?
            .add(&self.token_type.index_select(&types, 0)?)?;
        Ok((x.to_dtype(DType::F32)?, lens))
    }
}

/// The word-embedding table: the checkpoint's tensor, or its values as f16
/// bits `[vocab * hidden]` (CPU slice layers in bf16).
enum WordTable {
    Tensor(Tensor),
    F16(Vec<u16>),
}

/// `vb`'s `prefix.` when the encoder's weights are stored there, else `vb`.
fn under<'a>(vb: VarBuilder<'a>, prefix: &str) -> VarBuilder<'a> {
    if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
        vb.pp(prefix)
    } else {
        vb
    }
}

/// How a sentence vector is made from the token vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over every token of the sequence (its attention mask is all ones).
    Mean,
    /// The first token ([CLS]).
    Cls,
    /// The last token.
    LastToken,
}

/// Pools packed hidden states `[sum of lens, hidden]` into `[lens.len(), hidden]`.
pub fn pool(hidden: &Tensor, lens: &[usize], pooling: Pooling) -> Result<Tensor> {
    let mut rows = Vec::with_capacity(lens.len());
    let mut offset = 0;
    for &len in lens {
        if len == 0 {
            candle_core::bail!("cannot pool an empty sequence")
        }
        let seq = hidden.narrow(0, offset, len)?;
        rows.push(match pooling {
            Pooling::Mean => seq.mean_keepdim(0)?,
            Pooling::Cls => seq.narrow(0, 0, 1)?,
            Pooling::LastToken => seq.narrow(0, len - 1, 1)?,
        });
        offset += len;
    }
    Tensor::cat(&rows, 0)
}

/// The mean of each sequence's rows of `x` (packed `[total, h]`).
fn mean_rows(x: &[f32], lens: &[usize], h: usize) -> Vec<f32> {
    let mut out = vec![0f32; lens.len() * h];
    let mut start = 0;
    for (o, &len) in out.chunks_exact_mut(h).zip(lens) {
        for row in x[start * h..(start + len) * h].chunks_exact(h) {
            for (o, &r) in o.iter_mut().zip(row) {
                *o += r;
            }
        }
        let inv = 1.0 / len as f32;
        o.iter_mut().for_each(|v| *v *= inv);
        start += len;
    }
    out
}

/// Scales each row to unit L2 norm (a zero row stays zero).
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(1e-12)?;
    x.broadcast_div(&norm)
}

/// A sequence-classification model: the encoder, then over the first
/// token's vector a dense layer, tanh and a linear classifier; a
/// cross-encoder for reranking. BERT's head is its pooler plus `classifier`
/// (`BertForSequenceClassification`); RoBERTa's is `classifier.dense` plus
/// `classifier.out_proj` (`roberta.rs`).
pub struct CrossEncoder {
    pub(crate) encoder: Bert,
    pub(crate) dense: Linear,
    pub(crate) classifier: Linear,
}

impl CrossEncoder {
    /// Loads a `BertForSequenceClassification` checkpoint (`bert.*`,
    /// `bert.pooler.dense`, `classifier`).
    pub fn load_bert(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        let h = cfg.hidden_size;
        Ok(Self {
            encoder: Bert::new(cfg, vb.pp("bert"))?,
            dense: linear(vb.pp("bert.pooler.dense"), h, h)?,
            classifier: linear(vb.pp("classifier"), h, cfg.num_labels())?,
        })
    }

    pub fn encoder(&self) -> &Bert {
        &self.encoder
    }

    /// [`Bert::set_precision`] for the encoder (the head stays f32).
    pub fn set_precision(&mut self, precision: EncoderPrecision) -> Result<EncoderPrecision> {
        self.encoder.set_precision(precision)
    }

    /// Logits `[batch, num_labels]` for a packed batch of sentence pairs.
    pub fn forward(&self, batch: &[EncoderInput]) -> Result<Tensor> {
        let first = self.encoder.forward_pooled(batch, Pooling::Cls)?;
        let pooled = self.dense.forward(&first)?.tanh()?;
        self.classifier.forward(&pooled)
    }
}
