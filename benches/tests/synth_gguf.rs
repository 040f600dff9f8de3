//! `hearth-synth-gguf`'s writer on small shapes: the file reads back with
//! candle's GGUF reader, has llama.cpp's Q4_K_M type mix, loads in Hearth's
//! engine with the default model's tokenizer (padded with reserved control
//! tokens) and runs a forward with finite logits over the whole vocabulary.

use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::DType;
use hearth_benches::synth_gguf::{write, Quant, Shape};
use hearth_engine::catalog::Catalog;
use hearth_engine::load::load_gguf;
use hearth_engine::pull::{self, Progress};
use hearth_engine::tokenizer::encode;
use hearth_engine::Device;
use hearth_models::KvCache;

/// The default chat model's GGUF, pulled once like the engine's tests do.
fn default_gguf() -> PathBuf {
    let models = std::env::var_os("HEARTH_TEST_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
        .join("models");
    let catalog = Catalog::built_in();
    let entry = catalog
        .get("HuggingFaceTB/SmolLM2-135M-Instruct")
        .expect("in the catalogue");
    pull::ensure(entry, &models, Progress::Quiet).expect("the default model");
    entry.weights_path(&models)
}

fn small(tied: bool, layers: usize) -> Shape {
    Shape {
        name: "small".into(),
        hidden: 256,
        layers,
        heads: 4,
        kv_heads: 2,
        ffn: 512,
        vocab: 49_152 + 100,
        tied,
        context: 512,
        rope_theta: 500_000.0,
    }
}

fn check(shape: &Shape, quant: Quant) -> Content {
    let source = default_gguf();
    let dir = std::env::temp_dir().join(format!("hearth-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{:?}-{}.gguf", quant, shape.tied));
    let bytes = write(shape, quant, &source, &out).expect("writing");
    assert_eq!(bytes, std::fs::metadata(&out).unwrap().len());

    let mut f = std::fs::File::open(&out).unwrap();
    let content = Content::read(&mut f).expect("reads back");
    let tokens = content.metadata["tokenizer.ggml.tokens"].to_vec().unwrap();
    assert_eq!(tokens.len(), shape.vocab);
    assert_eq!(
        tokens[shape.vocab - 1].to_string().unwrap(),
        "<|reserved_special_token_99|>"
    );
    let types = content.metadata["tokenizer.ggml.token_type"]
        .to_vec()
        .unwrap();
    assert!(matches!(types[shape.vocab - 1], Value::I32(3)));
    assert_eq!(
        content.metadata["llama.block_count"].to_u32().unwrap() as usize,
        shape.layers
    );
    assert_eq!(
        content.tensor_infos.contains_key("output.weight"),
        !shape.tied
    );
    // Every tensor was written in full: candle reads each one.
    for name in content.tensor_infos.keys() {
        let t = content
            .tensor(&mut f, name, &Device::Cpu)
            .expect("tensor data");
        assert_eq!(t.dtype(), content.tensor_infos[name].ggml_dtype);
    }

    // Hearth loads it and runs it; the tokenizer is the source's.
    let lm = load_gguf(&out, &Device::Cpu).expect("Hearth loads the file");
    let info = lm.model.info().clone();
    assert_eq!(info.vocab_size, shape.vocab);
    assert_eq!(info.num_layers, shape.layers);
    let src = load_gguf(&source, &Device::Cpu).unwrap();
    let text = "The quick brown fox jumps over the lazy dog.";
    let ids = encode(&lm.tokenizer, text, false).unwrap();
    assert_eq!(ids, encode(&src.tokenizer, text, false).unwrap());
    let mut cache = KvCache::new(
        info.num_layers,
        info.num_kv_heads,
        info.head_dim,
        64,
        DType::F16,
    )
    .unwrap();
    let logits = lm.model.forward(&ids, &mut cache).expect("forward");
    let logits: Vec<f32> = logits.to_vec1().unwrap();
    assert_eq!(logits.len(), shape.vocab);
    assert!(logits.iter().all(|x| x.is_finite()));
    // Random weights still give different logits per token.
    let first = logits[0];
    assert!(logits.iter().any(|&x| x != first));
    std::fs::remove_file(&out).unwrap();
    content
}

#[test]
fn q4_k_m_file_has_llama_cpps_mix_and_runs() {
    // 16 layers: use_more_bits picks 0, 1, 4, 7, 10, 13, 14 and 15.
    let content = check(&small(false, 16), Quant::Q4KM);
    let dtype = |n: &str| content.tensor_infos[n].ggml_dtype;
    for l in 0..16 {
        let more = [0, 1, 4, 7, 10, 13, 14, 15].contains(&l);
        let want = if more { GgmlDType::Q6K } else { GgmlDType::Q4K };
        assert_eq!(dtype(&format!("blk.{l}.attn_v.weight")), want, "layer {l}");
        assert_eq!(
            dtype(&format!("blk.{l}.ffn_down.weight")),
            want,
            "layer {l}"
        );
        assert_eq!(dtype(&format!("blk.{l}.attn_q.weight")), GgmlDType::Q4K);
        assert_eq!(dtype(&format!("blk.{l}.ffn_norm.weight")), GgmlDType::F32);
    }
    assert_eq!(dtype("output.weight"), GgmlDType::Q6K);
    assert_eq!(dtype("token_embd.weight"), GgmlDType::Q4K);
}

#[test]
fn q3_k_m_file_has_llama_cpps_mix_and_runs() {
    let content = check(&small(false, 16), Quant::Q3KM);
    let dtype = |n: &str| content.tensor_infos[n].ggml_dtype;
    for l in 0..16 {
        let v = if l < 2 {
            GgmlDType::Q5K
        } else {
            GgmlDType::Q4K
        };
        assert_eq!(dtype(&format!("blk.{l}.attn_v.weight")), v, "layer {l}");
        let down = if l < 1 {
            GgmlDType::Q5K
        } else {
            GgmlDType::Q4K
        };
        assert_eq!(dtype(&format!("blk.{l}.ffn_down.weight")), down);
        assert_eq!(dtype(&format!("blk.{l}.attn_q.weight")), GgmlDType::Q3K);
        assert_eq!(dtype(&format!("blk.{l}.ffn_up.weight")), GgmlDType::Q3K);
    }
    assert_eq!(dtype("output.weight"), GgmlDType::Q6K);
    assert_eq!(dtype("token_embd.weight"), GgmlDType::Q3K);
}

#[test]
fn q2_k_file_has_llama_cpps_mix_and_runs() {
    let content = check(&small(false, 4), Quant::Q2K);
    let dtype = |n: &str| content.tensor_infos[n].ggml_dtype;
    for l in 0..4 {
        // 4 query heads on 2 KV heads: attn_v stays at Q3_K.
        assert_eq!(dtype(&format!("blk.{l}.attn_v.weight")), GgmlDType::Q3K);
        assert_eq!(dtype(&format!("blk.{l}.ffn_down.weight")), GgmlDType::Q3K);
        assert_eq!(
            dtype(&format!("blk.{l}.attn_output.weight")),
            GgmlDType::Q3K
        );
        assert_eq!(dtype(&format!("blk.{l}.attn_q.weight")), GgmlDType::Q2K);
        assert_eq!(dtype(&format!("blk.{l}.ffn_up.weight")), GgmlDType::Q2K);
    }
    assert_eq!(dtype("output.weight"), GgmlDType::Q6K);
    assert_eq!(dtype("token_embd.weight"), GgmlDType::Q2K);
}

#[test]
fn q8_0_file_with_a_tied_head_runs() {
    let content = check(&small(true, 2), Quant::Q8_0);
    assert_eq!(
        content.tensor_infos["token_embd.weight"].ggml_dtype,
        GgmlDType::Q8_0
    );
    assert_eq!(
        content.tensor_infos["blk.1.ffn_down.weight"].ggml_dtype,
        GgmlDType::Q8_0
    );
}
