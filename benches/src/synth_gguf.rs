//! Random-weight GGUF files shaped like the Llama models people run, so that
//! decode and prefill can be measured at 1B and 8B sizes without downloads.
//!
//! A file gets the layer shapes of a [`Shape`] (hidden size, layers, heads,
//! feed-forward size, vocabulary), the tokenizer metadata of a source GGUF
//! (the default chat model's), padded with reserved control tokens up to the
//! shape's vocabulary, and random weights (uniform, standard deviation 0.02;
//! norms 1) quantized the way llama.cpp's `llama-quantize` types a
//! [`Quant::Q4KM`], [`Quant::Q3KM`], [`Quant::Q2K`], [`Quant::Q6K`] or
//! [`Quant::Q8_0`] file. Tensors are generated, quantized and written one
//! row chunk at a time, so an 8B file needs a few hundred megabytes of
//! memory, not its size.
//!
//! ```sh
//! cargo run --release -p hearth-benches --bin hearth-synth-gguf -- \
//!     --shape llama-3.1-8b --quant q4_k_m --out /tmp/synth-8b.Q4_K_M.gguf
//! ```

use std::io::{BufWriter, Seek, Write};
use std::path::Path;

use anyhow::{bail, Context};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// The sizes of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub name: String,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// The output head shares the token table (no `output.weight`).
    pub tied: bool,
    pub context: usize,
    pub rope_theta: f32,
}

impl Shape {
    /// Llama-3.2-1B's sizes (tied head).
    pub fn llama_3_2_1b() -> Shape {
        Shape {
            name: "llama-3.2-1b".into(),
            hidden: 2048,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            ffn: 8192,
            vocab: 128_256,
            tied: true,
            context: 131_072,
            rope_theta: 500_000.0,
        }
    }

    /// Llama-3.1-8B's sizes (separate head).
    pub fn llama_3_1_8b() -> Shape {
        Shape {
            name: "llama-3.1-8b".into(),
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            ffn: 14_336,
            vocab: 128_256,
            tied: false,
            context: 131_072,
            rope_theta: 500_000.0,
        }
    }

    /// A preset by name: `llama-3.2-1b` or `llama-3.1-8b`.
    pub fn preset(name: &str) -> anyhow::Result<Shape> {
        match name {
            "llama-3.2-1b" => Ok(Self::llama_3_2_1b()),
            "llama-3.1-8b" => Ok(Self::llama_3_1_8b()),
            other => bail!("unknown shape `{other}` (llama-3.2-1b or llama-3.1-8b)"),
        }
    }

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Every tensor: GGUF name, rows, columns (row length) and layer index
    /// (`None` outside the blocks).
    fn tensors(&self) -> Vec<(String, usize, usize, Option<usize>)> {
        let kv = self.kv_heads * self.head_dim();
        let mut out = vec![(
            "token_embd.weight".to_string(),
            self.vocab,
            self.hidden,
            None,
        )];
        for i in 0..self.layers {
            let l = Some(i);
            for (part, rows, cols) in [
                ("attn_norm", 1, self.hidden),
                ("attn_q", self.hidden, self.hidden),
                ("attn_k", kv, self.hidden),
                ("attn_v", kv, self.hidden),
                ("attn_output", self.hidden, self.hidden),
                ("ffn_norm", 1, self.hidden),
                ("ffn_gate", self.ffn, self.hidden),
                ("ffn_up", self.ffn, self.hidden),
                ("ffn_down", self.hidden, self.ffn),
            ] {
                out.push((format!("blk.{i}.{part}.weight"), rows, cols, l));
            }
        }
        out.push(("output_norm.weight".into(), 1, self.hidden, None));
        if !self.tied {
            out.push(("output.weight".into(), self.vocab, self.hidden, None));
        }
        out
    }
}

/// The file's quantization mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// Every matrix Q8_0.
    Q8_0,
    /// Every matrix Q6_K (llama.cpp's `Q6_K`).
    Q6K,
    /// llama.cpp's `Q4_K_M`: Q4_K, with Q6_K for the output head (or the
    /// tied token table) and for `attn_v` and `ffn_down` in the layers where
    /// llama.cpp's `use_more_bits` says so.
    Q4KM,
    /// llama.cpp's `Q3_K_M`: Q3_K, with Q6_K for the output head (or the
    /// tied token table), Q4_K for `attn_output`, and for `attn_v` Q5_K in
    /// the first two layers and Q4_K after, for `ffn_down` Q5_K in the
    /// first sixteenth of the layers and Q4_K after.
    Q3KM,
    /// llama.cpp's `Q2_K`: Q2_K, with Q6_K for the output head (or the tied
    /// token table), Q3_K for `attn_output` and `ffn_down`, and for
    /// `attn_v` Q4_K where four or more query heads share a KV head (Q3_K
    /// otherwise).
    Q2K,
}

impl Quant {
    pub fn parse(s: &str) -> anyhow::Result<Quant> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Quant::Q8_0),
            "q6_k" => Ok(Quant::Q6K),
            "q4_k_m" => Ok(Quant::Q4KM),
            "q3_k_m" => Ok(Quant::Q3KM),
            "q2_k" => Ok(Quant::Q2K),
            other => bail!("unknown quantization `{other}` (q8_0, q6_k, q4_k_m, q3_k_m or q2_k)"),
        }
    }

    /// llama.cpp's `general.file_type` value.
    fn file_type(self) -> u32 {
        match self {
            Quant::Q8_0 => 7,
            Quant::Q6K => 18,
            Quant::Q4KM => 15,
            Quant::Q3KM => 12,
            Quant::Q2K => 10,
        }
    }
}

/// llama.cpp's rule for the layers that get more bits in `Q4_K_M`.
fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8
        || layer >= 7 * layers / 8
        || (layer as isize - (layers / 8) as isize) % 3 == 2
}

/// The type of one tensor in a file of `quant`.
pub fn tensor_type(name: &str, layer: Option<usize>, shape: &Shape, quant: Quant) -> GgmlDType {
    if name.ends_with("_norm.weight") {
        return GgmlDType::F32;
    }
    match quant {
        Quant::Q8_0 => GgmlDType::Q8_0,
        Quant::Q6K => GgmlDType::Q6K,
        Quant::Q4KM => {
            let head = name == "output.weight" || (shape.tied && name == "token_embd.weight");
            let more = |l: Option<usize>| l.is_some_and(|l| use_more_bits(l, shape.layers));
            let v_or_down = name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight");
            if head || (v_or_down && more(layer)) {
                GgmlDType::Q6K
            } else {
                GgmlDType::Q4K
            }
        }
        Quant::Q3KM => {
            let head = name == "output.weight" || (shape.tied && name == "token_embd.weight");
            let l = layer.unwrap_or(0);
            if head {
                GgmlDType::Q6K
            } else if name.ends_with("attn_v.weight") {
                if l < 2 {
                    GgmlDType::Q5K
                } else {
                    GgmlDType::Q4K
                }
            } else if name.ends_with("ffn_down.weight") {
                if l < shape.layers / 16 {
                    GgmlDType::Q5K
                } else {
                    GgmlDType::Q4K
                }
            } else if name.ends_with("attn_output.weight") {
                GgmlDType::Q4K
            } else {
                GgmlDType::Q3K
            }
        }
        Quant::Q2K => {
            let head = name == "output.weight" || (shape.tied && name == "token_embd.weight");
            if head {
                GgmlDType::Q6K
            } else if name.ends_with("attn_v.weight") {
                if shape.heads >= 4 * shape.kv_heads {
                    GgmlDType::Q4K
                } else {
                    GgmlDType::Q3K
                }
            } else if name.ends_with("ffn_down.weight") || name.ends_with("attn_output.weight") {
                GgmlDType::Q3K
            } else {
                GgmlDType::Q2K
            }
        }
    }
}

/// The source's `tokenizer.*` metadata, its token list (and types and
/// scores, where present) padded to `vocab` with reserved control tokens.
pub fn tokenizer_metadata(source: &Content, vocab: usize) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let tokens = match source.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t.len(),
        _ => bail!("the source GGUF has no tokenizer.ggml.tokens"),
    };
    if tokens > vocab {
        bail!("the source's vocabulary ({tokens}) is larger than the shape's ({vocab})");
    }
    let mut keys: Vec<&String> = source
        .metadata
        .keys()
        .filter(|k| k.starts_with("tokenizer."))
        .collect();
    keys.sort();
    for key in keys {
        let mut value = source.metadata[key].clone();
        if let Value::Array(items) = &mut value {
            if items.len() == tokens {
                let pad = |i: usize| match key.as_str() {
                    "tokenizer.ggml.tokens" => {
                        Some(Value::String(format!("<|reserved_special_token_{i}|>")))
                    }
                    // llama.cpp's CONTROL token type.
                    "tokenizer.ggml.token_type" => Some(Value::I32(3)),
                    "tokenizer.ggml.scores" => Some(Value::F32(0.0)),
                    _ => None,
                };
                for i in 0..vocab - tokens {
                    match pad(i) {
                        Some(v) => items.push(v),
                        None => bail!("cannot pad per-token metadata `{key}`"),
                    }
                }
            }
        }
        out.push((key.clone(), value));
    }
    Ok(out)
}

/// The model's `general.*` and `llama.*` metadata.
fn model_metadata(shape: &Shape, quant: Quant) -> Vec<(String, Value)> {
    let u = |v: usize| Value::U32(v as u32);
    vec![
        ("general.architecture".into(), Value::String("llama".into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic {}", shape.name)),
        ),
        ("general.file_type".into(), Value::U32(quant.file_type())),
        ("llama.vocab_size".into(), u(shape.vocab)),
        ("llama.context_length".into(), u(shape.context)),
        ("llama.embedding_length".into(), u(shape.hidden)),
        ("llama.block_count".into(), u(shape.layers)),
        ("llama.feed_forward_length".into(), u(shape.ffn)),
        ("llama.attention.head_count".into(), u(shape.heads)),
        ("llama.attention.head_count_kv".into(), u(shape.kv_heads)),
        ("llama.rope.dimension_count".into(), u(shape.head_dim())),
        ("llama.rope.freq_base".into(), Value::F32(shape.rope_theta)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-5),
        ),
    ]
}

/// GGUF's value type codes.
fn type_code(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> anyhow::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x])?,
        Value::I8(x) => w.write_all(&x.to_le_bytes())?,
        Value::U16(x) => w.write_all(&x.to_le_bytes())?,
        Value::I16(x) => w.write_all(&x.to_le_bytes())?,
        Value::U32(x) => w.write_all(&x.to_le_bytes())?,
        Value::I32(x) => w.write_all(&x.to_le_bytes())?,
        Value::U64(x) => w.write_all(&x.to_le_bytes())?,
        Value::I64(x) => w.write_all(&x.to_le_bytes())?,
        Value::F32(x) => w.write_all(&x.to_le_bytes())?,
        Value::F64(x) => w.write_all(&x.to_le_bytes())?,
        Value::Bool(x) => w.write_all(&[u8::from(*x)])?,
        Value::String(s) => write_str(w, s)?,
        Value::Array(items) => {
            let code = items.first().map_or(4, type_code);
            if items.iter().any(|i| type_code(i) != code) {
                bail!("a GGUF array holds values of one type only");
            }
            w.write_all(&code.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            for item in items {
                write_value(w, item)?;
            }
        }
    }
    Ok(())
}

/// ggml's type codes of the types these files hold.
fn ggml_type_code(dtype: GgmlDType) -> anyhow::Result<u32> {
    Ok(match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        other => bail!("{other:?} is not written by this tool"),
    })
}

/// Bytes of a `rows x cols` tensor of `dtype`.
fn tensor_bytes(dtype: GgmlDType, rows: usize, cols: usize) -> usize {
    rows * cols / dtype.block_size() * dtype.type_size()
}

const ALIGN: usize = 32;

fn pad_to(w: &mut impl Write, pos: usize) -> std::io::Result<usize> {
    let pad = (ALIGN - pos % ALIGN) % ALIGN;
    w.write_all(&vec![0u8; pad])?;
    Ok(pos + pad)
}

/// A seeded xorshift generator: uniform values with standard deviation 0.02.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        // [-1, 1) scaled so that the standard deviation is 0.02.
        let unit = (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        unit * 0.02 * 3f32.sqrt()
    }
}

/// `rows x cols` random values starting at row `first`, quantized to `dtype`.
fn quantized_rows(
    dtype: GgmlDType,
    seed: u64,
    first: usize,
    rows: usize,
    cols: usize,
) -> anyhow::Result<Vec<u8>> {
    if dtype == GgmlDType::F32 {
        return Ok(std::iter::repeat_n(1f32.to_le_bytes(), rows * cols)
            .flatten()
            .collect());
    }
    let mut rng = Rng::new(seed ^ ((first as u64) << 20));
    let values: Vec<f32> = (0..rows * cols).map(|_| rng.uniform()).collect();
    let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu)?;
    let q = QTensor::quantize(&t, dtype)?;
    Ok(q.data()?.into_owned())
}

/// Rows generated per task (and per rayon worker) while writing a tensor.
const CHUNK_ROWS: usize = 64;

/// Writes a random-weight GGUF of `shape` in `quant` to `out`, with the
/// tokenizer metadata of `source`. Returns the file's size in bytes.
pub fn write(shape: &Shape, quant: Quant, source: &Path, out: &Path) -> anyhow::Result<u64> {
    let mut src =
        std::fs::File::open(source).with_context(|| format!("cannot open {}", source.display()))?;
    let content = Content::read(&mut src)
        .map_err(|e| anyhow::anyhow!("{} is not a GGUF file: {e}", source.display()))?;
    let mut metadata = model_metadata(shape, quant);
    metadata.extend(tokenizer_metadata(&content, shape.vocab)?);
    let tensors: Vec<_> = shape
        .tensors()
        .into_iter()
        .map(|(name, rows, cols, layer)| {
            let dtype = tensor_type(&name, layer, shape, quant);
            (name, rows, cols, dtype)
        })
        .collect();

    let file =
        std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    w.write_all(&0x4655_4747u32.to_le_bytes())?; // "GGUF"
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in &metadata {
        write_str(&mut w, key)?;
        w.write_all(&type_code(value).to_le_bytes())?;
        write_value(&mut w, value)?;
    }
    let mut offset = 0usize;
    for (name, rows, cols, dtype) in &tensors {
        write_str(&mut w, name)?;
        let dims: Vec<u64> = if *rows == 1 {
            vec![*cols as u64]
        } else {
            vec![*cols as u64, *rows as u64]
        };
        w.write_all(&(dims.len() as u32).to_le_bytes())?;
        for d in dims {
            w.write_all(&d.to_le_bytes())?;
        }
        w.write_all(&ggml_type_code(*dtype)?.to_le_bytes())?;
        w.write_all(&(offset as u64).to_le_bytes())?;
        offset += tensor_bytes(*dtype, *rows, *cols).div_ceil(ALIGN) * ALIGN;
    }
    w.flush()?;
    let header_end = w.stream_position()? as usize;
    let mut pos = pad_to(&mut w, header_end)?;
    for (index, (name, rows, cols, dtype)) in tensors.iter().enumerate() {
        let start = pos;
        let chunks: Vec<usize> = (0..*rows).step_by(CHUNK_ROWS).collect();
        // A batch of chunks at a time: parallel generation, ordered writes.
        for group in chunks.chunks(rayon::current_num_threads() * 4) {
            let parts: Vec<Vec<u8>> = group
                .par_iter()
                .map(|&first| {
                    let n = CHUNK_ROWS.min(rows - first);
                    quantized_rows(*dtype, index as u64 + 1, first, n, *cols)
                })
                .collect::<anyhow::Result<_>>()?;
            for part in parts {
                w.write_all(&part)?;
                pos += part.len();
            }
        }
        if pos - start != tensor_bytes(*dtype, *rows, *cols) {
            bail!(
                "{name}: wrote {} bytes, its header says otherwise",
                pos - start
            );
        }
        pos = pad_to(&mut w, pos)?;
    }
    w.flush()?;
    Ok(pos as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_types_follow_llama_cpp() {
        let s = Shape::llama_3_1_8b();
        // 32 layers: the first 4 and last 4, and every third one between.
        let more: Vec<usize> = (0..32).filter(|&l| use_more_bits(l, 32)).collect();
        assert_eq!(
            more,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let t = |n: &str, l| tensor_type(n, l, &s, Quant::Q4KM);
        assert_eq!(t("blk.0.attn_v.weight", Some(0)), GgmlDType::Q6K);
        assert_eq!(t("blk.4.attn_v.weight", Some(4)), GgmlDType::Q4K);
        assert_eq!(t("blk.6.ffn_down.weight", Some(6)), GgmlDType::Q6K);
        assert_eq!(t("blk.6.ffn_up.weight", Some(6)), GgmlDType::Q4K);
        assert_eq!(t("output.weight", None), GgmlDType::Q6K);
        assert_eq!(t("token_embd.weight", None), GgmlDType::Q4K);
        assert_eq!(t("blk.3.attn_norm.weight", Some(3)), GgmlDType::F32);
        let tied = Shape::llama_3_2_1b();
        assert_eq!(
            tensor_type("token_embd.weight", None, &tied, Quant::Q4KM),
            GgmlDType::Q6K
        );
        assert_eq!(
            tensor_type("token_embd.weight", None, &tied, Quant::Q8_0),
            GgmlDType::Q8_0
        );
        for name in ["token_embd.weight", "blk.4.attn_q.weight", "output.weight"] {
            assert_eq!(tensor_type(name, Some(4), &s, Quant::Q6K), GgmlDType::Q6K);
        }
        assert_eq!(
            tensor_type("blk.4.ffn_norm.weight", Some(4), &s, Quant::Q6K),
            GgmlDType::F32
        );
    }

    #[test]
    fn q3_k_m_types_follow_llama_cpp() {
        let s = Shape::llama_3_1_8b();
        let t = |n: &str, l| tensor_type(n, l, &s, Quant::Q3KM);
        assert_eq!(t("blk.0.attn_q.weight", Some(0)), GgmlDType::Q3K);
        assert_eq!(t("blk.9.ffn_gate.weight", Some(9)), GgmlDType::Q3K);
        assert_eq!(t("blk.9.ffn_up.weight", Some(9)), GgmlDType::Q3K);
        assert_eq!(t("blk.1.attn_v.weight", Some(1)), GgmlDType::Q5K);
        assert_eq!(t("blk.2.attn_v.weight", Some(2)), GgmlDType::Q4K);
        // 32 layers: the first two get Q5_K for ffn_down.
        assert_eq!(t("blk.1.ffn_down.weight", Some(1)), GgmlDType::Q5K);
        assert_eq!(t("blk.2.ffn_down.weight", Some(2)), GgmlDType::Q4K);
        assert_eq!(t("blk.5.attn_output.weight", Some(5)), GgmlDType::Q4K);
        assert_eq!(t("output.weight", None), GgmlDType::Q6K);
        assert_eq!(t("token_embd.weight", None), GgmlDType::Q3K);
        let tied = Shape::llama_3_2_1b();
        assert_eq!(
            tensor_type("token_embd.weight", None, &tied, Quant::Q3KM),
            GgmlDType::Q6K
        );
    }

    #[test]
    fn q2_k_types_follow_llama_cpp() {
        let s = Shape::llama_3_1_8b();
        let t = |n: &str, l| tensor_type(n, l, &s, Quant::Q2K);
        assert_eq!(t("blk.0.attn_q.weight", Some(0)), GgmlDType::Q2K);
        assert_eq!(t("blk.0.attn_k.weight", Some(0)), GgmlDType::Q2K);
        assert_eq!(t("blk.9.ffn_gate.weight", Some(9)), GgmlDType::Q2K);
        assert_eq!(t("blk.9.ffn_up.weight", Some(9)), GgmlDType::Q2K);
        // 32 query heads on 8 KV heads.
        assert_eq!(t("blk.1.attn_v.weight", Some(1)), GgmlDType::Q4K);
        assert_eq!(t("blk.1.ffn_down.weight", Some(1)), GgmlDType::Q3K);
        assert_eq!(t("blk.5.attn_output.weight", Some(5)), GgmlDType::Q3K);
        assert_eq!(t("output.weight", None), GgmlDType::Q6K);
        assert_eq!(t("token_embd.weight", None), GgmlDType::Q2K);
        let narrow = Shape {
            kv_heads: 16,
            ..Shape::llama_3_2_1b()
        };
        assert_eq!(
            tensor_type("blk.0.attn_v.weight", Some(0), &narrow, Quant::Q2K),
            GgmlDType::Q3K
        );
        assert_eq!(
            tensor_type("token_embd.weight", None, &narrow, Quant::Q2K),
            GgmlDType::Q6K
        );
    }

    #[test]
    fn presets_have_the_published_parameter_counts() {
        let params = |s: &Shape| s.tensors().iter().map(|(_, r, c, _)| r * c).sum::<usize>();
        // Llama-3.2-1B: 1.24B parameters; Llama-3.1-8B: 8.03B.
        let b1 = params(&Shape::llama_3_2_1b()) as f64 / 1e9;
        let b8 = params(&Shape::llama_3_1_8b()) as f64 / 1e9;
        assert!((1.23..1.25).contains(&b1), "{b1}");
        assert!((8.02..8.04).contains(&b8), "{b8}");
    }

    #[test]
    fn rng_has_the_asked_spread() {
        let mut r = Rng::new(7);
        let xs: Vec<f32> = (0..100_000).map(|_| r.uniform()).collect();
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 1e-3, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 5e-4, "{}", var.sqrt());
    }
}
