//! The tokenizer, chat template and incremental decoder against llama.cpp's
//! reference for SmolLM2-135M-Instruct (`shared/fixtures/smollm2_greedy.json`),
//! using the real GGUF's metadata.

mod common;

use std::sync::{Arc, OnceLock};

use candle_core::quantized::gguf_file::Content;
use hearth_core::ChatMessage;
use hearth_engine::chat_template::ChatTemplate;
use hearth_engine::detok::{token_bytes, IncrementalDecoder};
use hearth_engine::tokenizer::{
    encode, encode_no_special, gguf_tokenizer_meta, tokenizer_from_gguf, GgufTokenizerMeta,
};
use serde_json::Value;
use tokenizers::Tokenizer;

struct Loaded {
    tokenizer: Arc<Tokenizer>,
    meta: GgufTokenizerMeta,
    fixture: Value,
}

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let path = common::smollm_gguf();
        let mut file = std::fs::File::open(&path).expect("open GGUF");
        let content = Content::read(&mut file).expect("read GGUF metadata");
        let tokenizer = tokenizer_from_gguf(&content).expect("build tokenizer");
        Loaded {
            tokenizer: Arc::new(tokenizer),
            meta: gguf_tokenizer_meta(&content),
            fixture: common::fixture("smollm2_greedy.json"),
        }
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn piece_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(bytes) => bytes.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
        other => panic!("bad piece {other}"),
    }
}

#[test]
fn gguf_metadata() {
    let l = loaded();
    assert_eq!(l.meta.bos_id, Some(1));
    assert_eq!(l.meta.eos_id, Some(2));
    assert_eq!(l.meta.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(l.meta.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(!l.meta.add_bos);
    assert_eq!(
        l.meta.chat_template.as_deref(),
        l.fixture["model"]["chat_template"].as_str()
    );
    assert_eq!(l.tokenizer.get_vocab_size(true), 49152);
    assert_eq!(encode(&l.tokenizer, "Hello", true).unwrap(), vec![19556]);
}

#[test]
fn tokenizer_cases_match_llama_cpp() {
    let l = loaded();
    let cases = l.fixture["tokenizer_cases"].as_array().unwrap();
    assert!(cases.len() >= 21);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let add_special = case["add_special"].as_bool().unwrap();
        let parse_special = case["parse_special"].as_bool().unwrap();
        let expected = ids(&case["token_ids"]);
        let got = if parse_special {
            encode(&l.tokenizer, text, add_special).unwrap()
        } else {
            encode_no_special(&l.tokenizer, text, add_special).unwrap()
        };
        assert_eq!(
            got, expected,
            "token ids of {text:?} (parse_special={parse_special})"
        );

        let detok = l.tokenizer.decode(&expected, false).unwrap();
        assert_eq!(
            detok,
            case["detokenized"].as_str().unwrap(),
            "detokenized {text:?}"
        );

        let pieces = case["pieces"].as_array().unwrap();
        assert_eq!(pieces.len(), expected.len());
        for (id, piece) in expected.iter().zip(pieces) {
            assert_eq!(
                token_bytes(&l.tokenizer, *id),
                piece_bytes(piece),
                "bytes of token {id} in {text:?}"
            );
        }
    }
}

#[test]
fn prompt_token_ids_match_rendered_text() {
    let l = loaded();
    for case in l.fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let rendered = case["rendered_text"].as_str().unwrap();
        assert_eq!(
            encode(&l.tokenizer, rendered, false).unwrap(),
            ids(&case["prompt_token_ids"]),
            "{name}"
        );
        assert_eq!(
            encode(&l.tokenizer, rendered, true).unwrap(),
            ids(&case["prompt_token_ids_with_add_special"]),
            "{name} with add_special"
        );
    }
}

#[test]
fn chat_template_renders_like_llama_cpp() {
    let l = loaded();
    let template = ChatTemplate::new(
        l.meta
            .chat_template
            .as_deref()
            .expect("the GGUF has a chat template"),
        l.meta.bos_token.clone(),
        l.meta.eos_token.clone(),
    )
    .unwrap();
    let mut chat_cases = 0;
    for case in l.fixture["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let rendered = case["rendered_text"].as_str().unwrap();
        if case["kind"].as_str() != Some("chat") {
            assert_eq!(prompt, rendered);
            continue;
        }
        chat_cases += 1;
        let messages = [ChatMessage {
            role: "user".into(),
            content: prompt.into(),
        }];
        assert_eq!(
            template.render(&messages, true).unwrap(),
            rendered,
            "{}",
            case["name"]
        );
    }
    assert_eq!(chat_cases, 3);
}

#[test]
fn incremental_decoding_matches_generated_text() {
    let l = loaded();
    for case in l.fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let generated = ids(&case["generated_token_ids"]);
        for (skip, key) in [
            (true, "generated_text"),
            (false, "generated_text_detokenized_with_specials"),
        ] {
            let mut decoder = IncrementalDecoder::new(l.tokenizer.clone(), skip);
            let mut text = String::new();
            for &id in &generated {
                let chunk = decoder.push(id);
                assert!(!chunk.contains('\u{FFFD}'), "{name}: chunk {chunk:?}");
                text.push_str(&chunk);
            }
            text.push_str(&decoder.finish());
            assert_eq!(text, case[key].as_str().unwrap(), "{name} ({key})");
        }
    }
}

#[test]
fn incremental_decoding_of_tokenizer_cases() {
    // The fixture's multi-byte strings split characters across tokens.
    let l = loaded();
    for case in l.fixture["tokenizer_cases"].as_array().unwrap() {
        let expected = ids(&case["token_ids"]);
        let mut decoder = IncrementalDecoder::new(l.tokenizer.clone(), false);
        let mut text = String::new();
        for &id in &expected {
            let chunk = decoder.push(id);
            assert!(!chunk.contains('\u{FFFD}'));
            text.push_str(&chunk);
        }
        text.push_str(&decoder.finish());
        assert_eq!(text, case["detokenized"].as_str().unwrap());
    }
}
