//! Tokenizers: built from GGUF metadata or loaded from a `tokenizer.json`.
//!
//! [`tokenizer_from_gguf`] rebuilds a byte-level BPE tokenizer (the GGUF `gpt2`
//! tokenizer model) from `tokenizer.ggml.*` metadata: vocabulary, merges, token
//! types (control tokens become special added tokens, so `<|im_start|>` in text
//! parses to its id), the llama.cpp pre-tokenizer name (`tokenizer.ggml.pre`),
//! and BOS/EOS insertion. Candle's own GGUF tokenizer gets SmolLM2 wrong, so it
//! is not used.
//!
//! [`gguf_tokenizer_meta`] reads the special token ids and the chat template, and
//! [`encode_no_special`] tokenizes text with special-token text treated as plain
//! text (llama.cpp's `parse_special=false`).

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer,
    PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

/// GGUF token type of control tokens (`<|im_start|>`, `<|endoftext|>`...).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens (matched in text, not special).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer regex (llama.cpp `llama-bpe`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's pre-tokenizer regex (llama.cpp `qwen2`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tokenizer-related metadata of a GGUF file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GgufTokenizerMeta {
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// The Jinja chat template (`tokenizer.chat_template`).
    pub chat_template: Option<String>,
    /// The BOS token's text, e.g. `<|im_start|>`.
    pub bos_token: Option<String>,
    /// The EOS token's text, e.g. `<|im_end|>`.
    pub eos_token: Option<String>,
    /// `tokenizer.ggml.add_bos_token` (false when absent).
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token` (false when absent).
    pub add_eos: bool,
}

/// Any GGUF integer as i64.
fn value_as_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        Value::Bool(x) => *x as i64,
        _ => return None,
    })
}

fn meta_u32(content: &Content, key: &str) -> Option<u32> {
    content
        .metadata
        .get(key)
        .and_then(value_as_i64)
        .and_then(|v| u32::try_from(v).ok())
}

fn meta_bool(content: &Content, key: &str) -> Option<bool> {
    match content.metadata.get(key)? {
        Value::Bool(b) => Some(*b),
        other => value_as_i64(other).map(|v| v != 0),
    }
}

fn meta_str<'a>(content: &'a Content, key: &str) -> Option<&'a str> {
    match content.metadata.get(key)? {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn meta_string_array(content: &Content, key: &str) -> anyhow::Result<Vec<String>> {
    let value = content
        .metadata
        .get(key)
        .ok_or_else(|| anyhow!("GGUF metadata has no `{key}`"))?;
    let items = value
        .to_vec()
        .map_err(|e| anyhow!("GGUF `{key}` is not an array: {e}"))?;
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            other => bail!("GGUF `{key}` holds a non-string: {other:?}"),
        })
        .collect()
}

/// Reads the special token ids, their texts and the chat template.
pub fn gguf_tokenizer_meta(content: &Content) -> GgufTokenizerMeta {
    let bos_id = meta_u32(content, "tokenizer.ggml.bos_token_id");
    let eos_id = meta_u32(content, "tokenizer.ggml.eos_token_id");
    let token_text = |id: Option<u32>| -> Option<String> {
        let id = id? as usize;
        match content.metadata.get("tokenizer.ggml.tokens")? {
            Value::Array(items) => match items.get(id)? {
                Value::String(s) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        }
    };
    GgufTokenizerMeta {
        bos_id,
        eos_id,
        chat_template: meta_str(content, "tokenizer.chat_template").map(str::to_owned),
        bos_token: token_text(bos_id),
        eos_token: token_text(eos_id),
        add_bos: meta_bool(content, "tokenizer.ggml.add_bos_token").unwrap_or(false),
        add_eos: meta_bool(content, "tokenizer.ggml.add_eos_token").unwrap_or(false),
    }
}

/// The pre-tokenizer and `ignore_merges` flag for a llama.cpp pre-tokenizer name.
fn pre_tokenizer_for(pre: &str) -> anyhow::Result<(PreTokenizerWrapper, bool)> {
    let byte_level_regex = || ByteLevel::new(false, true, true);
    let split_then_bytes = |regex: &str| -> anyhow::Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(regex.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("bad pre-tokenizer regex: {e}"))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])))
    };
    Ok(match pre {
        // llama.cpp: "\p{N}" (each digit alone), then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (
                PreTokenizerWrapper::Sequence(Sequence::new(vec![
                    PreTokenizerWrapper::Digits(Digits::new(true)),
                    PreTokenizerWrapper::ByteLevel(byte_level_regex()),
                ])),
                false,
            )
        }
        "gpt2" | "gpt-2" | "default" => (PreTokenizerWrapper::ByteLevel(byte_level_regex()), false),
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => {
            (split_then_bytes(LLAMA3_REGEX)?, true)
        }
        "qwen2" | "deepseek-r1-qwen" => (split_then_bytes(QWEN2_REGEX)?, false),
        other => {
            tracing::warn!(
                pre = other,
                "unknown GGUF pre-tokenizer; falling back to GPT-2 byte-level splitting"
            );
            (PreTokenizerWrapper::ByteLevel(byte_level_regex()), false)
        }
    })
}

/// Builds a byte-level BPE tokenizer from GGUF metadata (`tokenizer.ggml.model = "gpt2"`).
pub fn tokenizer_from_gguf(content: &Content) -> anyhow::Result<Tokenizer> {
    let model = meta_str(content, "tokenizer.ggml.model").unwrap_or("gpt2");
    if model != "gpt2" {
        bail!("GGUF tokenizer model `{model}` is not supported (only byte-level BPE `gpt2`); provide a tokenizer.json instead");
    }
    let tokens = meta_string_array(content, "tokenizer.ggml.tokens")?;
    let merges = meta_string_array(content, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match content.metadata.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .to_vec()
            .map_err(|e| anyhow!("GGUF `tokenizer.ggml.token_type` is not an array: {e}"))?
            .iter()
            .map(|t| value_as_i64(t).unwrap_or(1))
            .collect(),
        None => Vec::new(),
    };

    let mut vocab = Vocab::default();
    for (id, tok) in tokens.iter().enumerate() {
        if vocab.contains_key(tok) {
            tracing::warn!(token = %tok, id, "duplicate token in GGUF vocabulary; keeping the first");
            continue;
        }
        vocab.insert(tok.clone(), id as u32);
    }
    let merges: Vec<(String, String)> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| anyhow!("malformed GGUF merge `{m}`"))
        })
        .collect::<anyhow::Result<_>>()?;

    let pre = meta_str(content, "tokenizer.ggml.pre").unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer_for(pre)?;

    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| anyhow!("cannot build the BPE model from GGUF metadata: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (id, ty) in types.iter().enumerate() {
        let Some(text) = tokens.get(id) else { break };
        match *ty {
            TOKEN_TYPE_CONTROL => special.push(AddedToken::from(text.clone(), true)),
            TOKEN_TYPE_USER_DEFINED => {
                user_defined.push(AddedToken::from(text.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user_defined);

    let meta = gguf_tokenizer_meta(content);
    // Template keys are placeholders ("BOS"/"EOS"), so token texts with ':' or
    // spaces cannot confuse the template parser.
    let mut specials: Vec<SpecialToken> = Vec::new();
    let bos = if meta.add_bos {
        let (Some(id), Some(tok)) = (meta.bos_id, meta.bos_token.clone()) else {
            bail!("GGUF asks to add a BOS token but has no valid `tokenizer.ggml.bos_token_id`");
        };
        specials.push(
            SpecialToken::new("BOS".into(), vec![id], vec![tok]).map_err(|e| anyhow!("{e}"))?,
        );
        Some("BOS")
    } else {
        None
    };
    let eos = if meta.add_eos {
        let (Some(id), Some(tok)) = (meta.eos_id, meta.eos_token.clone()) else {
            bail!("GGUF asks to add an EOS token but has no valid `tokenizer.ggml.eos_token_id`");
        };
        specials.push(
            SpecialToken::new("EOS".into(), vec![id], vec![tok]).map_err(|e| anyhow!("{e}"))?,
        );
        Some("EOS")
    } else {
        None
    };
    // One sequence: [BOS] $X [EOS], with the given type id.
    let part = |seq: &str, type_id: u32| -> Vec<String> {
        let mut v = Vec::new();
        v.extend(bos.iter().map(|t| format!("{t}:{type_id}")));
        v.push(format!("${seq}:{type_id}"));
        v.extend(eos.iter().map(|t| format!("{t}:{type_id}")));
        v
    };
    let single = part("A", 0);
    let mut pair = part("A", 0);
    pair.extend(part("B", 1));
    if meta.add_bos || meta.add_eos {
        let processor = TemplateProcessing::builder()
            .try_single(single)
            .map_err(|e| anyhow!("BOS/EOS template: {e}"))?
            .try_pair(pair)
            .map_err(|e| anyhow!("BOS/EOS template: {e}"))?
            .special_tokens(specials)
            .build()
            .map_err(|e| anyhow!("BOS/EOS template: {e}"))?;
        tokenizer.with_post_processor(Some(processor));
    }
    Ok(tokenizer)
}

/// Loads a Hugging Face `tokenizer.json`.
pub fn tokenizer_from_file(path: impl AsRef<Path>) -> anyhow::Result<Tokenizer> {
    let path = path.as_ref();
    Tokenizer::from_file(path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("cannot load tokenizer {}", path.display()))
}

/// Encodes text, parsing special-token text (`<|im_start|>`) into its id
/// (llama.cpp `parse_special=true`). `add_special` adds BOS/EOS as the tokenizer says.
pub fn encode(tokenizer: &Tokenizer, text: &str, add_special: bool) -> anyhow::Result<Vec<u32>> {
    let enc = tokenizer
        .encode_fast(text, add_special)
        .map_err(|e| anyhow!("tokenization failed: {e}"))?;
    Ok(enc.get_ids().to_vec())
}

/// Encodes text as plain text: special-token text such as `<|im_start|>` is split
/// like any other text (llama.cpp `parse_special=false`). User-defined added tokens
/// are not matched either. `add_special` still adds BOS/EOS as the tokenizer says.
pub fn encode_no_special(
    tokenizer: &Tokenizer,
    text: &str,
    add_special: bool,
) -> anyhow::Result<Vec<u32>> {
    let fail = |e: tokenizers::Error| anyhow!("tokenization failed: {e}");
    let mut pts = PreTokenizedString::from(text);
    if let Some(normalizer) = tokenizer.get_normalizer() {
        pts.normalize(|s| normalizer.normalize(s)).map_err(fail)?;
    }
    if let Some(pre) = tokenizer.get_pre_tokenizer() {
        pre.pre_tokenize(&mut pts).map_err(fail)?;
    }
    let model = tokenizer.get_model();
    pts.tokenize(|s| model.tokenize(s.get())).map_err(fail)?;
    let enc = pts.into_encoding(None, 0, OffsetType::None).map_err(fail)?;
    let enc = tokenizer
        .post_process(enc, None, add_special)
        .map_err(fail)?;
    Ok(enc.get_ids().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detok::gpt2_byte_to_char;
    use candle_core::quantized::gguf_file::VersionedMagic;

    /// A GGUF-like metadata set: 256 byte tokens, merges for "he", "hel", "12",
    /// control tokens `<s>` and `</s>`, and a user-defined token `<tool>`.
    fn content(pre: &str, add_bos: bool, add_eos: bool) -> Content {
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| gpt2_byte_to_char(b).to_string())
            .collect();
        let mut types = vec![Value::I32(1); 256];
        let merges = ["h e", "he l", "1 2"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
            types.push(Value::I32(1));
        }
        for (tok, ty) in [("<s>", 3), ("</s>", 3), ("<tool>", 4)] {
            tokens.push(tok.into());
            types.push(Value::I32(ty));
        }
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        let mut metadata = std::collections::HashMap::new();
        metadata.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        metadata.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
        metadata.insert("tokenizer.ggml.tokens".into(), strings(tokens));
        metadata.insert(
            "tokenizer.ggml.merges".into(),
            strings(merges.iter().map(|m| m.to_string()).collect()),
        );
        metadata.insert("tokenizer.ggml.token_type".into(), Value::Array(types));
        metadata.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(259));
        metadata.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(260));
        metadata.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos));
        metadata.insert("tokenizer.ggml.add_eos_token".into(), Value::Bool(add_eos));
        metadata.insert(
            "tokenizer.chat_template".into(),
            Value::String("{{ x }}".into()),
        );
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: Default::default(),
            tensor_data_offset: 0,
        }
    }

    #[test]
    fn meta_is_read() {
        let m = gguf_tokenizer_meta(&content("smollm", true, false));
        assert_eq!(m.bos_id, Some(259));
        assert_eq!(m.eos_id, Some(260));
        assert_eq!(m.bos_token.as_deref(), Some("<s>"));
        assert_eq!(m.eos_token.as_deref(), Some("</s>"));
        assert_eq!(m.chat_template.as_deref(), Some("{{ x }}"));
        assert!(m.add_bos && !m.add_eos);
    }

    #[test]
    fn bos_and_eos_are_added_only_when_asked() {
        let t = tokenizer_from_gguf(&content("smollm", false, false)).unwrap();
        assert_eq!(encode(&t, "hel", true).unwrap(), vec![257]);
        let t = tokenizer_from_gguf(&content("smollm", true, false)).unwrap();
        assert_eq!(encode(&t, "hel", true).unwrap(), vec![259, 257]);
        assert_eq!(encode(&t, "hel", false).unwrap(), vec![257]);
        let t = tokenizer_from_gguf(&content("smollm", true, true)).unwrap();
        assert_eq!(encode(&t, "hel", true).unwrap(), vec![259, 257, 260]);
        assert_eq!(
            encode_no_special(&t, "hel", true).unwrap(),
            vec![259, 257, 260]
        );
    }

    #[test]
    fn control_tokens_parse_and_user_defined_tokens_match() {
        let t = tokenizer_from_gguf(&content("smollm", false, false)).unwrap();
        assert_eq!(
            encode(&t, "<s>he<tool>", false).unwrap(),
            vec![259, 256, 261]
        );
        // Plain-text encoding splits the control token's text.
        let plain = encode_no_special(&t, "<s>he", false).unwrap();
        assert_eq!(plain, vec![b'<' as u32, b's' as u32, b'>' as u32, 256]);
        // Control tokens are special (skipped), user-defined ones are not.
        assert_eq!(t.decode(&[259, 256, 261], true).unwrap(), "he<tool>");
        assert_eq!(t.decode(&[259, 256, 261], false).unwrap(), "<s>he<tool>");
    }

    #[test]
    fn smollm_splits_digits_but_gpt2_does_not() {
        let smollm = tokenizer_from_gguf(&content("smollm", false, false)).unwrap();
        assert_eq!(
            encode(&smollm, "12", false).unwrap(),
            vec![b'1' as u32, b'2' as u32]
        );
        let gpt2 = tokenizer_from_gguf(&content("gpt2", false, false)).unwrap();
        assert_eq!(encode(&gpt2, "12", false).unwrap(), vec![258]);
        // Unknown names fall back to GPT-2 splitting; llama3/qwen2 regexes build.
        let other = tokenizer_from_gguf(&content("no-such-pre", false, false)).unwrap();
        assert_eq!(encode(&other, "12", false).unwrap(), vec![258]);
        for pre in ["llama-bpe", "qwen2"] {
            let t = tokenizer_from_gguf(&content(pre, false, false)).unwrap();
            let ids = encode(&t, "hello 12!", false).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), "hello 12!");
        }
    }

    #[test]
    fn non_bpe_gguf_is_refused() {
        let mut c = content("smollm", false, false);
        c.metadata
            .insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = tokenizer_from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("not supported"), "{err}");
    }

    #[test]
    fn tokenizer_json_round_trips() {
        let t = tokenizer_from_gguf(&content("smollm", true, false)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        t.save(&path, false).unwrap();
        let loaded = tokenizer_from_file(&path).unwrap();
        for text in ["hel 12 <s>x", "héllo wörld"] {
            assert_eq!(
                encode(&loaded, text, true).unwrap(),
                encode(&t, text, true).unwrap()
            );
        }
        assert!(tokenizer_from_file(dir.path().join("missing.json")).is_err());
    }
}
