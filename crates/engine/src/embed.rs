//! Embedding models: a sentence-transformers folder loaded into a BERT
//! encoder behind the [`crate::batcher`].
//!
//! What is read from the folder (as sentence-transformers does it):
//! - `config.json`: the encoder ([`EncoderConfig`], tagged on `model_type`);
//! - `tokenizer.json`: with its padding and truncation switched off (the
//!   file of all-MiniLM-L6-v2 pads every input to 128 and cuts at 128);
//! - `sentence_bert_config.json`: `max_seq_length`, the longest input;
//! - `modules.json`: the pooling module's folder, and whether a `Normalize`
//!   module follows;
//! - `<pooling folder>/config.json`: mean, CLS or last-token pooling.
//!
//! A bi-encoder serves rerank too: query and documents are embedded and
//! scored by cosine similarity ([`cosine`]). Cross-encoders (catalogue kind
//! `rerank`) are loaded by [`crate::cross_encoder`] behind the same
//! [`EmbedModel`] and batcher.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use hearth_models::{l2_normalize, Bert, EncoderConfig, EncoderInput, EncoderPrecision, Pooling};
use serde::Deserialize;
use tokenizers::Tokenizer;

use crate::batcher::{BatcherConfig, Encoder, EncoderHandle};
use crate::catalog::{CatalogEntry, ModelKind};

/// What the handlers need to serve an embedding model.
#[derive(Clone)]
pub struct EmbedModel {
    pub entry: CatalogEntry,
    /// Padding and truncation off; adds [CLS] / [SEP] as the model expects.
    pub tokenizer: Arc<Tokenizer>,
    /// Longest input in tokens (special tokens included).
    pub max_tokens: usize,
    /// Token ids below this are the model's (added tokens included);
    /// counted once at load, as the tokenizer counts them by building its
    /// whole vocabulary map.
    pub vocab_size: usize,
    /// Length of the vectors.
    pub dimensions: usize,
    /// Whether vectors are L2-normalised.
    pub normalize: bool,
    /// A cross-encoder (catalogue kind `rerank`): it scores query-document
    /// pairs ([`crate::cross_encoder`]) and gives no embeddings; its
    /// tokenizer truncates pairs to `max_tokens`.
    pub cross_encoder: bool,
    /// The dense layers' arithmetic in effect (`f32` or `bf16`).
    pub precision: EncoderPrecision,
    pub encoder: EncoderHandle,
}

/// The sentence-transformers settings of a model folder.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceConfig {
    pub max_seq_length: Option<usize>,
    pub pooling: Pooling,
    pub normalize: bool,
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingFile {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

/// Parses the pooling mode of `1_Pooling/config.json` (exactly one of mean,
/// CLS or last token must be on).
pub fn parse_pooling(json: &str) -> anyhow::Result<Pooling> {
    let p: PoolingFile = serde_json::from_str(json)?;
    anyhow::ensure!(
        !p.pooling_mode_max_tokens && !p.pooling_mode_mean_sqrt_len_tokens,
        "max and mean-sqrt-len pooling are not supported"
    );
    match (
        p.pooling_mode_mean_tokens,
        p.pooling_mode_cls_token,
        p.pooling_mode_lasttoken,
    ) {
        (true, false, false) => Ok(Pooling::Mean),
        (false, true, false) => Ok(Pooling::Cls),
        (false, false, true) => Ok(Pooling::LastToken),
        _ => anyhow::bail!("the pooling config must select one of mean, cls or lasttoken"),
    }
}

/// Reads the sentence-transformers files of `dir`. Without `modules.json` the
/// model is taken as mean pooling without normalisation.
pub fn read_sentence_config(dir: &Path) -> anyhow::Result<SentenceConfig> {
    let max_seq_length = std::fs::read(dir.join("sentence_bert_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["max_seq_length"].as_u64())
        .map(|n| n as usize);
    let modules: Vec<Module> = match std::fs::read(dir.join("modules.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes)?,
        Err(_) => Vec::new(),
    };
    let pooling = match modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
        Some(m) => parse_pooling(&std::fs::read_to_string(
            dir.join(&m.path).join("config.json"),
        )?)?,
        None => Pooling::Mean,
    };
    let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
    Ok(SentenceConfig {
        max_seq_length,
        pooling,
        normalize,
    })
}

/// BERT + pooling (+ normalisation) as the batcher's [`Encoder`].
pub struct SentenceEncoder {
    pub bert: Bert,
    pub pooling: Pooling,
    pub normalize: bool,
}

impl SentenceEncoder {
    /// Encodes a batch into one vector per sequence.
    pub fn embed(&self, batch: &[&[u32]]) -> candle_core::Result<Vec<Vec<f32>>> {
        let inputs: Vec<EncoderInput> = batch.iter().map(|ids| EncoderInput::new(ids)).collect();
        let mut pooled = self.bert.forward_pooled(&inputs, self.pooling)?;
        if self.normalize {
            pooled = l2_normalize(&pooled)?;
        }
        pooled.to_vec2::<f32>()
    }
}

impl Encoder for SentenceEncoder {
    fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
        let ids: Vec<&[u32]> = batch.iter().map(|b| b.ids).collect();
        self.embed(&ids).map_err(|e| e.to_string())
    }
}

/// Loads a tokenizer with padding and truncation switched off.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let mut tokenizer = Tokenizer::from_file(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(tokenizer)
}

/// A loaded sentence encoder with its tokenizer and limits.
pub struct LoadedEncoder {
    pub encoder: SentenceEncoder,
    pub tokenizer: Tokenizer,
    pub max_tokens: usize,
    pub dimensions: usize,
}

/// An encoder folder's `config.json` and its `model.safetensors` weights
/// (f32, memory-mapped) on `device`.
pub fn read_encoder_folder(
    dir: &Path,
    device: &Device,
) -> anyhow::Result<(EncoderConfig, candle_nn::VarBuilder<'static>)> {
    let config: EncoderConfig = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
    let weights = dir.join("model.safetensors");
    // SAFETY: the file is memory-mapped read-only and not modified while mapped.
    let vb =
        unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[weights], DType::F32, device)? };
    Ok((config, vb))
}

/// Reads a sentence-transformers folder onto `device` (f32).
pub fn load_sentence_encoder(dir: &Path, device: &Device) -> anyhow::Result<LoadedEncoder> {
    let (config, vb) = read_encoder_folder(dir, device)?;
    let st = read_sentence_config(dir)?;
    let tokenizer = load_tokenizer(&dir.join("tokenizer.json"))?;
    let bert = config.load_encoder(vb)?;
    // Uploaded here, run on the batcher's thread.
    hearth_models::settle(device)?;
    let max_tokens = st
        .max_seq_length
        .unwrap_or(bert.max_positions())
        .min(bert.max_positions());
    let dimensions = bert.hidden_size();
    Ok(LoadedEncoder {
        encoder: SentenceEncoder {
            bert,
            pooling: st.pooling,
            normalize: st.normalize,
        },
        tokenizer,
        max_tokens,
        dimensions,
    })
}

impl EmbedModel {
    /// Loads `entry` (an `embed` or `rerank` model) with its dense layers
    /// at `precision` ([`Bert::set_precision`]) and starts its batcher.
    pub fn start(
        entry: &CatalogEntry,
        models_dir: &Path,
        device: &Device,
        config: BatcherConfig,
        precision: EncoderPrecision,
    ) -> anyhow::Result<Self> {
        if entry.kind == ModelKind::Rerank {
            let limit = entry.context_length.max(1);
            let mut loaded =
                crate::cross_encoder::load_cross_encoder(&entry.dir(models_dir), device, limit)?;
            let precision = loaded.encoder.model.set_precision(precision)?;
            return Ok(Self {
                entry: entry.clone(),
                vocab_size: loaded.tokenizer.get_vocab_size(true),
                tokenizer: Arc::new(loaded.tokenizer),
                max_tokens: loaded.max_tokens,
                dimensions: 1,
                normalize: false,
                cross_encoder: true,
                precision,
                encoder: EncoderHandle::start(loaded.encoder, config),
            });
        }
        anyhow::ensure!(
            entry.kind == ModelKind::Embed,
            "model `{}` is not an embedding or rerank model",
            entry.id
        );
        let mut loaded = load_sentence_encoder(&entry.dir(models_dir), device)?;
        let precision = loaded.encoder.bert.set_precision(precision)?;
        let normalize = loaded.encoder.normalize;
        Ok(Self {
            entry: entry.clone(),
            vocab_size: loaded.tokenizer.get_vocab_size(true),
            tokenizer: Arc::new(loaded.tokenizer),
            max_tokens: loaded.max_tokens.min(entry.context_length.max(1)),
            dimensions: loaded.dimensions,
            normalize,
            cross_encoder: false,
            precision,
            encoder: EncoderHandle::start(loaded.encoder, config),
        })
    }
}

/// Cosine similarity (0 when either vector is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_config_modes() {
        let mean = r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false}"#;
        assert_eq!(parse_pooling(mean).unwrap(), Pooling::Mean);
        let cls = r#"{"pooling_mode_cls_token": true}"#;
        assert_eq!(parse_pooling(cls).unwrap(), Pooling::Cls);
        let last = r#"{"pooling_mode_lasttoken": true}"#;
        assert_eq!(parse_pooling(last).unwrap(), Pooling::LastToken);
        assert!(parse_pooling(r#"{"pooling_mode_max_tokens": true}"#).is_err());
        assert!(parse_pooling("{}").is_err());
    }

    #[test]
    fn sentence_config_from_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
        std::fs::write(
            dir.path().join("1_Pooling/config.json"),
            r#"{"pooling_mode_cls_token": true}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
               {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("sentence_bert_config.json"),
            r#"{"max_seq_length": 256}"#,
        )
        .unwrap();
        let st = read_sentence_config(dir.path()).unwrap();
        assert_eq!(
            st,
            SentenceConfig {
                max_seq_length: Some(256),
                pooling: Pooling::Cls,
                normalize: false
            }
        );
    }

    #[test]
    fn cosine_basics() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0.0, 3.0]).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
