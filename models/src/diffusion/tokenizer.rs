//! CLIP's BPE tokenizer, from `tokenizer/tokenizer.json` when the folder has
//! one, else built from `tokenizer/vocab.json` + `merges.txt` the way CLIP
//! tokenizes: NFC, whitespace runs collapsed, lowercased; split by CLIP's
//! pattern; byte-level symbols; BPE with a `</w>` end-of-word suffix.
//! Every prompt becomes exactly `max_len` ids: `<|startoftext|>`, the
//! prompt's tokens (truncated), `<|endoftext|>`, then padding.

use super::config::read_json;
use candle_core::{bail, Result};
use serde_json::Value;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as NormSequence, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

pub(crate) const BOS: &str = "<|startoftext|>";
pub(crate) const EOS: &str = "<|endoftext|>";

/// CLIP's pre-tokenizer pattern (case is already folded by the normalizer).
const CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

fn tok_err(what: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("tokenizer: {what}: {e}"))
}

pub(crate) struct ClipTokenizer {
    tokenizer: Tokenizer,
    bos: u32,
    eos: u32,
    pad: u32,
    max_len: usize,
}

impl ClipTokenizer {
    /// Loads `dir` (the `tokenizer/` folder); prompts become `max_len` ids.
    pub(crate) fn load(dir: &Path, max_len: usize) -> Result<Self> {
        if max_len < 2 {
            bail!("tokenizer: max length {max_len} cannot hold BOS and EOS")
        }
        let json = dir.join("tokenizer.json");
        let tokenizer = if json.is_file() {
            Tokenizer::from_file(&json).map_err(|e| tok_err("reading tokenizer.json", e))?
        } else {
            Self::from_vocab_merges(dir)?
        };
        let id = |t: &str| {
            tokenizer
                .token_to_id(t)
                .ok_or_else(|| tok_err("vocabulary", format!("no token {t}")))
        };
        let bos = id(BOS)?;
        let eos = id(EOS)?;
        let pad = match Self::configured_pad(dir)? {
            Some(p) => id(&p)?,
            None => eos,
        };
        Ok(Self {
            tokenizer,
            bos,
            eos,
            pad,
            max_len,
        })
    }

    fn from_vocab_merges(dir: &Path) -> Result<Tokenizer> {
        let vocab = dir.join("vocab.json");
        let merges = dir.join("merges.txt");
        let bpe = BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy())
            .end_of_word_suffix("</w>".into())
            .unk_token(EOS.into())
            .build()
            .map_err(|e| tok_err("reading vocab.json/merges.txt", e))?;
        let mut tokenizer = Tokenizer::new(bpe);
        let whitespace = Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::Regex(r"\s+".into()),
            " ",
        )
        .map_err(|e| tok_err("normalizer", e))?;
        tokenizer.with_normalizer(Some(NormSequence::new(vec![
            NFC.into(),
            whitespace.into(),
            Lowercase.into(),
        ])));
        let split = Split::new(
            SplitPattern::Regex(CLIP_PATTERN.into()),
            SplitDelimiterBehavior::Removed,
            true,
        )
        .map_err(|e| tok_err("pre-tokenizer", e))?;
        tokenizer.with_pre_tokenizer(Some(PreSequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])));
        tokenizer.add_special_tokens(&[AddedToken::from(BOS, true), AddedToken::from(EOS, true)]);
        Ok(tokenizer)
    }

    /// `pad_token` of `tokenizer_config.json` (a string or `{"content": ..}`).
    fn configured_pad(dir: &Path) -> Result<Option<String>> {
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(None);
        }
        let config: Value = read_json(&path)?;
        Ok(match config.get("pad_token") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(String::from),
            _ => None,
        })
    }

    /// `max_len` ids: BOS, the prompt (truncated), EOS, padding.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| tok_err("encoding", e))?;
        let body = encoding.get_ids();
        let body = &body[..body.len().min(self.max_len - 2)];
        let mut ids = Vec::with_capacity(self.max_len);
        ids.push(self.bos);
        ids.extend_from_slice(body);
        ids.push(self.eos);
        ids.resize(self.max_len, self.pad);
        Ok(ids)
    }
}
