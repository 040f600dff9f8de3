//! RoBERTa and XLM-RoBERTa: the BERT encoder of `bert.rs` with three
//! differences, as in Hugging Face `RobertaModel` /
//! `RobertaForSequenceClassification`
//! (<https://github.com/huggingface/transformers/blob/main/src/transformers/models/roberta/modeling_roberta.py>;
//! XLM-R shares the code):
//! - positions count from `pad_token_id + 1` (2 with the usual pad id 1), so
//!   a 514-row position table holds 512 tokens;
//! - one segment: every token is segment 0 (pair inputs are `<s> A </s></s>
//!   B </s>` without segment ids);
//! - task checkpoints keep the encoder under `roberta.`, and the
//!   classification head is `classifier.dense`, tanh, `classifier.out_proj`
//!   over the first token, with no pooler.

use candle_core::Result;
use candle_nn::VarBuilder;

use crate::bert::{linear, Bert, BertConfig, CrossEncoder, Layout};

/// Hugging Face's default `pad_token_id` for RoBERTa.
const DEFAULT_PAD: u32 = 1;

fn layout(cfg: &BertConfig) -> Layout {
    Layout {
        position_offset: cfg.pad_token_id.unwrap_or(DEFAULT_PAD) as usize + 1,
        segments: false,
    }
}

/// The encoder from a `RobertaModel` checkpoint (weights at the root, as
/// sentence-transformers saves them) or a task checkpoint (`roberta.*`).
pub(crate) fn load_encoder(cfg: &BertConfig, vb: VarBuilder) -> Result<Bert> {
    Bert::load_under(cfg, vb, "roberta", layout(cfg))
}

/// A `RobertaForSequenceClassification` (or XLM-R) checkpoint.
pub(crate) fn load_cross_encoder(cfg: &BertConfig, vb: VarBuilder) -> Result<CrossEncoder> {
    let h = cfg.hidden_size;
    let head = vb.pp("classifier");
    Ok(CrossEncoder {
        encoder: Bert::with_layout(cfg, vb.pp("roberta"), layout(cfg))?,
        dense: linear(head.pp("dense"), h, h)?,
        classifier: linear(head.pp("out_proj"), h, cfg.num_labels())?,
    })
}
