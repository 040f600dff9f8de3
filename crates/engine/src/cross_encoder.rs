//! Cross-encoder rerank models: a `BertForSequenceClassification` or
//! `(XLM)RobertaForSequenceClassification` folder (Hugging Face
//! `config.json`, `model.safetensors`, `tokenizer.json`) that
//! reads the query and one document together as a sentence pair and gives
//! the pair a relevance score.
//!
//! The query and the document are tokenized as a pair by the model's
//! tokenizer (BERT: `[CLS] query [SEP] document [SEP]`, segment ids 0 then
//! 1; RoBERTa: `<s> query </s></s> document </s>`), cut longest-first to the model's
//! maximum length, and go through the same [`crate::batcher`] as embeddings,
//! one pair per input. The score is what sentence-transformers'
//! `CrossEncoder.predict` gives by default: the sigmoid of the logit for a
//! one-label model (the MS MARCO rerankers), the softmax probability of the
//! last label otherwise.

use std::path::Path;

use candle_core::Device;
use hearth_models::{CrossEncoder as CrossEncoderModel, EncoderInput};
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};

use crate::batcher::{EncodeItem, Encoder};

/// A loaded cross-encoder, run by the batcher.
pub struct CrossEncoder {
    pub model: CrossEncoderModel,
}

/// Scores from `[batch, labels]` logits (see the module docs).
pub fn scores_from_logits(logits: &[Vec<f32>]) -> Vec<f32> {
    logits
        .iter()
        .map(|row| match row.as_slice() {
            [logit] => 1.0 / (1.0 + (-logit).exp()),
            row => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|x| (x - max).exp()).sum();
                row.last().map_or(0.0, |last| (last - max).exp() / sum)
            }
        })
        .collect()
}

impl CrossEncoder {
    /// One score per pair.
    pub fn score(&self, batch: &[EncoderInput<'_>]) -> candle_core::Result<Vec<f32>> {
        let logits = self.model.forward(batch)?.to_vec2::<f32>()?;
        Ok(scores_from_logits(&logits))
    }
}

impl Encoder for CrossEncoder {
    fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
        self.score(batch)
            .map(|s| s.into_iter().map(|x| vec![x]).collect())
            .map_err(|e| e.to_string())
    }
}

/// A loaded cross-encoder with its pair tokenizer and length limit.
pub struct LoadedCrossEncoder {
    pub encoder: CrossEncoder,
    /// Padding off; pairs truncated longest-first to `max_tokens`.
    pub tokenizer: Tokenizer,
    pub max_tokens: usize,
}

/// Reads a cross-encoder folder onto `device` (f32).
pub fn load_cross_encoder(
    dir: &Path,
    device: &Device,
    max_tokens: usize,
) -> anyhow::Result<LoadedCrossEncoder> {
    let (config, vb) = crate::embed::read_encoder_folder(dir, device)?;
    let model = config.load_cross_encoder(vb)?;
    hearth_models::settle(device)?;
    let max_tokens = max_tokens.min(model.encoder().max_positions()).max(4);
    let mut tokenizer = crate::embed::load_tokenizer(&dir.join("tokenizer.json"))?;
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_tokens,
            strategy: TruncationStrategy::LongestFirst,
            ..Default::default()
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(LoadedCrossEncoder {
        encoder: CrossEncoder { model },
        tokenizer,
        max_tokens,
    })
}

/// Tokenizes `query` with each document as pairs (truncated to the
/// tokenizer's limit).
pub fn pair_items(
    tokenizer: &Tokenizer,
    query: &str,
    documents: &[String],
) -> Result<Vec<EncodeItem>, String> {
    documents
        .iter()
        .map(|doc| {
            let enc = tokenizer
                .encode((query, doc.as_str()), true)
                .map_err(|e| e.to_string())?;
            Ok(EncodeItem {
                ids: enc.get_ids().to_vec(),
                type_ids: Some(enc.get_type_ids().to_vec()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_label_is_a_sigmoid_and_more_labels_a_softmax() {
        let s = scores_from_logits(&[vec![0.0], vec![2.0], vec![1.0, 1.0], vec![0.0, 3.0]]);
        assert!((s[0] - 0.5).abs() < 1e-6);
        assert!((s[1] - 0.880_797).abs() < 1e-5);
        assert!((s[2] - 0.5).abs() < 1e-6);
        assert!((s[3] - 0.952_574).abs() < 1e-5);
    }
}
