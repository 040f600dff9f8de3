//! Incremental detokenization and per-token bytes.
//!
//! [`IncrementalDecoder`] turns a stream of token ids into text chunks. It uses
//! the prefix-offset/read-offset technique (as in TGI and vLLM): decode a short
//! window of recent ids, compare it with the previous window's text and emit the
//! new suffix once it does not end in U+FFFD. So a character whose UTF-8 bytes are
//! split over several byte-level tokens (emoji, CJK) is held back until complete,
//! and the concatenation of all chunks plus [`IncrementalDecoder::finish`] equals
//! decoding the whole sequence at once.
//!
//! [`token_bytes`] and [`token_text`] give one token's raw bytes and lossy text,
//! for log-probabilities.

use std::sync::{Arc, LazyLock};

use tokenizers::{DecoderWrapper, Tokenizer};

/// GPT-2's byte-to-unicode table (`bytes_to_unicode` in `encoder.py`).
static BYTE_TO_CHAR: LazyLock<[char; 256]> = LazyLock::new(|| {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid char")
        };
    }
    table
});

/// The character GPT-2's byte-level BPE uses for byte `b`.
pub fn gpt2_byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// Inverse of [`BYTE_TO_CHAR`], indexed by char code (all codes are below 324).
static CHAR_TO_BYTE: LazyLock<[Option<u8>; 324]> = LazyLock::new(|| {
    let mut table = [None; 324];
    for b in 0..=255u8 {
        table[BYTE_TO_CHAR[b as usize] as usize] = Some(b);
    }
    table
});

/// The byte a GPT-2 byte-level character stands for, if it is one.
pub fn gpt2_char_to_byte(c: char) -> Option<u8> {
    CHAR_TO_BYTE.get(c as usize).copied().flatten()
}

/// Whether the tokenizer decodes with GPT-2 byte-level mapping.
pub fn is_byte_level(tokenizer: &Tokenizer) -> bool {
    fn has(d: &DecoderWrapper) -> bool {
        match d {
            DecoderWrapper::ByteLevel(_) => true,
            DecoderWrapper::Sequence(s) => s.get_decoders().iter().any(has),
            _ => false,
        }
    }
    tokenizer.get_decoder().is_some_and(has)
}

/// The raw bytes of one token: for byte-level tokens the GPT-2 mapping undone,
/// for added (special) tokens their content, for SentencePiece tokens `<0xNN>`
/// as the byte and `▁` as a space. Unknown ids give no bytes.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    if let Some(added) = tokenizer
        .get_added_vocabulary()
        .get_added_tokens_decoder()
        .get(&id)
    {
        return added.content.as_bytes().to_vec();
    }
    let Some(token) = tokenizer.id_to_token(id) else {
        return Vec::new();
    };
    if is_byte_level(tokenizer) {
        // Same fallback as the ByteLevel decoder: raw bytes if any char is unmapped.
        token
            .chars()
            .map(gpt2_char_to_byte)
            .collect::<Option<Vec<u8>>>()
            .unwrap_or_else(|| token.into_bytes())
    } else if let Some(hex) = token
        .strip_prefix("<0x")
        .and_then(|t| t.strip_suffix('>'))
        .filter(|h| h.len() == 2)
    {
        match u8::from_str_radix(hex, 16) {
            Ok(b) => vec![b],
            Err(_) => token.into_bytes(),
        }
    } else {
        token.replace('\u{2581}', " ").into_bytes()
    }
}

/// One token's text, lossy where its bytes are not valid UTF-8 on their own.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&token_bytes(tokenizer, id)).into_owned()
}

/// Turns token ids into text chunks as they arrive, never splitting a character.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Ids from the start of the current window (earlier ones are dropped).
    ids: Vec<u32>,
    /// Start of the ids whose text was already emitted and serves as context.
    prefix_offset: usize,
    /// End of the ids whose text was emitted.
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        if ids.is_empty() {
            return String::new();
        }
        match self.tokenizer.decode(ids, self.skip_special_tokens) {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(error = %e, "detokenization failed");
                String::new()
            }
        }
    }

    /// The text after `prefix` in `full`, if `full` extends it.
    fn suffix(prefix: &str, full: String) -> Option<String> {
        if full.len() > prefix.len() && full.starts_with(prefix) {
            Some(full[prefix.len()..].to_owned())
        } else if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            // The decoder changed earlier text (rare); emit what is new by length.
            Some(full[prefix.len()..].to_owned())
        } else {
            None
        }
    }

    /// Adds a token; returns the text that became final with it (maybe empty).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let prefix_text = self.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let new_text = self.decode(&self.ids[self.prefix_offset..]);
        if new_text.ends_with('\u{FFFD}') {
            return String::new();
        }
        let Some(out) = Self::suffix(&prefix_text, new_text) else {
            return String::new();
        };
        // Keep the just-emitted ids as context for the next window; drop older ones.
        let new_prefix = self.read_offset;
        self.ids.drain(..new_prefix);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        out
    }

    /// Releases text still held back (an incomplete character decodes to U+FFFD).
    pub fn finish(&mut self) -> String {
        let prefix_text = self.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let new_text = self.decode(&self.ids[self.prefix_offset..]);
        let out = Self::suffix(&prefix_text, new_text).unwrap_or_default();
        self.ids.drain(..self.read_offset);
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::AddedToken;

    /// A byte-level BPE with all 256 bytes plus merges that split multi-byte
    /// characters across tokens (e.g. `é` = [C3 A9] is one token, but the emoji
    /// `👩` = [F0 9F 91 A9] becomes [F0 9F] [91] [A9]), and `<|end|>` as special.
    pub(crate) fn tiny_tokenizer() -> Tokenizer {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        for b in 0..=255u8 {
            vocab.insert(gpt2_byte_to_char(b).to_string(), b as u32);
        }
        let pairs: Vec<(String, String)> = vec![
            (
                gpt2_byte_to_char(0xC3).to_string(),
                gpt2_byte_to_char(0xA9).to_string(),
            ),
            (
                gpt2_byte_to_char(0xF0).to_string(),
                gpt2_byte_to_char(0x9F).to_string(),
            ),
            (
                gpt2_byte_to_char(0xE6).to_string(),
                gpt2_byte_to_char(0x97).to_string(),
            ),
            ("h".into(), "e".into()),
            ("he".into(), "l".into()),
        ];
        let mut merges = Vec::new();
        for (a, b) in pairs {
            let merged = format!("{a}{b}");
            let next = vocab.len() as u32;
            vocab.entry(merged).or_insert(next);
            merges.push((a, b));
        }
        let vocab: tokenizers::models::bpe::Vocab = vocab.into_iter().collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .unwrap();
        let mut t = Tokenizer::new(bpe);
        t.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        t.with_decoder(Some(ByteLevelDecoder::default()));
        t.add_special_tokens(&[AddedToken::from("<|end|>", true)]);
        t
    }

    fn stream(t: &Arc<Tokenizer>, ids: &[u32], skip: bool) -> (Vec<String>, String) {
        let mut d = IncrementalDecoder::new(t.clone(), skip);
        let chunks: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
        let tail = d.finish();
        (chunks, tail)
    }

    #[test]
    fn gpt2_byte_map_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(gpt2_char_to_byte(gpt2_byte_to_char(b)), Some(b));
        }
        assert_eq!(gpt2_byte_to_char(b' '), 'Ġ');
        assert_eq!(gpt2_byte_to_char(b'\n'), 'Ċ');
        assert_eq!(gpt2_char_to_byte('€'), None);
    }

    #[test]
    fn multibyte_chars_are_never_split() {
        let t = Arc::new(tiny_tokenizer());
        for text in [
            "café",
            "日本語",
            "👩\u{200D}👩\u{200D}👧 hi",
            "aé👩b",
            "hello 日本",
        ] {
            let ids = t.encode(text, false).unwrap().get_ids().to_vec();
            let (chunks, tail) = stream(&t, &ids, true);
            let mut joined = String::new();
            for c in &chunks {
                assert!(!c.contains('\u{FFFD}'), "chunk {c:?} of {text:?}");
                joined.push_str(c);
            }
            joined.push_str(&tail);
            assert_eq!(joined, text);
            assert_eq!(joined, t.decode(&ids, true).unwrap());
        }
    }

    #[test]
    fn emoji_split_across_tokens_is_held_until_complete() {
        let t = Arc::new(tiny_tokenizer());
        let ids = t.encode("👩", false).unwrap().get_ids().to_vec();
        assert!(
            ids.len() >= 2,
            "the emoji should span several tokens: {ids:?}"
        );
        let (chunks, tail) = stream(&t, &ids, true);
        for c in &chunks[..chunks.len() - 1] {
            assert_eq!(c, "");
        }
        assert_eq!(chunks.last().unwrap(), "👩");
        assert_eq!(tail, "");
    }

    #[test]
    fn incomplete_tail_is_released_by_finish() {
        let t = Arc::new(tiny_tokenizer());
        // "a" then the first two bytes of an emoji, never completed.
        let f09f = format!("{}{}", gpt2_byte_to_char(0xF0), gpt2_byte_to_char(0x9F));
        let ids = vec![b'a' as u32, t.token_to_id(&f09f).unwrap()];
        let (chunks, tail) = stream(&t, &ids, true);
        let all = format!("{}{}", chunks.concat(), tail);
        assert_eq!(all, t.decode(&ids, true).unwrap());
        assert!(all.ends_with('\u{FFFD}'));
    }

    #[test]
    fn special_tokens_skipped_or_rendered() {
        let t = Arc::new(tiny_tokenizer());
        let end = t.token_to_id("<|end|>").unwrap();
        let mut ids = t.encode("hé", false).unwrap().get_ids().to_vec();
        ids.push(end);
        ids.extend(t.encode("日", false).unwrap().get_ids());
        let (c, tail) = stream(&t, &ids, true);
        assert_eq!(c.concat() + &tail, "hé日");
        let (c, tail) = stream(&t, &ids, false);
        assert_eq!(c.concat() + &tail, "hé<|end|>日");
    }

    #[test]
    fn token_bytes_undo_the_byte_map() {
        let t = tiny_tokenizer();
        let ids = t.encode("é 👩", false).unwrap().get_ids().to_vec();
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| token_bytes(&t, id)).collect();
        assert_eq!(bytes, "é 👩".as_bytes());
        let end = t.token_to_id("<|end|>").unwrap();
        assert_eq!(token_bytes(&t, end), b"<|end|>");
        assert_eq!(token_text(&t, 0xF0), "\u{FFFD}");
        assert_eq!(token_bytes(&t, 1_000_000), Vec::<u8>::new());
    }
}
