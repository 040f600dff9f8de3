//! Encoder configs: `config.json`'s `model_type` picks the architecture
//! (`bert.rs`, `roberta.rs`), and [`EncoderConfig`] loads its sentence
//! encoder or its cross-encoder.

use candle_core::Result;
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::bert::{Bert, BertConfig, CrossEncoder};
use crate::roberta;

/// `config.json` of an encoder, dispatched on `model_type`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "model_type")]
pub enum EncoderConfig {
    #[serde(rename = "bert")]
    Bert(BertConfig),
    #[serde(rename = "roberta")]
    Roberta(BertConfig),
    #[serde(rename = "xlm-roberta")]
    XlmRoberta(BertConfig),
}

impl EncoderConfig {
    /// The fields shared by every architecture here.
    pub fn config(&self) -> &BertConfig {
        match self {
            Self::Bert(c) | Self::Roberta(c) | Self::XlmRoberta(c) => c,
        }
    }

    /// The encoder of a sentence-embedding checkpoint (weights at the root or
    /// under the architecture's prefix).
    pub fn load_encoder(&self, vb: VarBuilder) -> Result<Bert> {
        match self {
            Self::Bert(c) => Bert::load(c, vb),
            Self::Roberta(c) | Self::XlmRoberta(c) => roberta::load_encoder(c, vb),
        }
    }

    /// A sequence-classification checkpoint (a cross-encoder).
    pub fn load_cross_encoder(&self, vb: VarBuilder) -> Result<CrossEncoder> {
        match self {
            Self::Bert(c) => CrossEncoder::load_bert(c, vb),
            Self::Roberta(c) | Self::XlmRoberta(c) => roberta::load_cross_encoder(c, vb),
        }
    }
}
