//! A tiny random-weight cross-encoder folder (`config.json`,
//! `model.safetensors`, a copied `tokenizer.json`), in the weight names and
//! shapes the architecture's loader asks for. Shared with the server's tests
//! (`#[path]`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use hearth_models::EncoderConfig;

/// The config of a two-layer, 32-wide `BertForSequenceClassification`
/// (`model_type` "bert") or `XLMRobertaForSequenceClassification`
/// ("xlm-roberta") with one label and BERT's vocabulary size, so MiniLM's
/// tokenizer fits it.
pub fn config(model_type: &str) -> serde_json::Value {
    let roberta = model_type != "bert";
    serde_json::json!({
        "model_type": model_type,
        "architectures": [if roberta { "XLMRobertaForSequenceClassification" } else { "BertForSequenceClassification" }],
        "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
        "max_position_embeddings": if roberta { 66 } else { 64 },
        "type_vocab_size": if roberta { 1 } else { 2 },
        "layer_norm_eps": 1e-12, "pad_token_id": if roberta { 1 } else { 0 },
        "id2label": {"0": "LABEL_0"}
    })
}

/// Writes the folder: `config`, random weights, and `tokenizer`'s copy.
/// The weights come from a fixed seed, the same in every run, so that what
/// the tests assert of their scores (distinct pairs scoring apart, say)
/// holds or fails for good rather than for some draws.
pub fn write_model(dir: &Path, config: &serde_json::Value, tokenizer: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let parsed: EncoderConfig = serde_json::from_value(config.clone()).unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    parsed.load_cross_encoder(vb).unwrap();
    // `VarBuilder::get` creates zeros: give every weight random values,
    // uniform with standard deviation `scale` (in name order).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let vars = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let var = &vars[name];
        let scale = if name.contains("LayerNorm") { 0.1 } else { 0.5 };
        let centre = if name.contains("LayerNorm.weight") {
            1.0
        } else {
            0.0
        };
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                centre + (2.0 * u - 1.0) * 3f32.sqrt() * scale
            })
            .collect();
        let value = Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap();
        var.set(&value).unwrap();
    }
    drop(vars);
    varmap.save(dir.join("model.safetensors")).unwrap();
    std::fs::copy(tokenizer, dir.join("tokenizer.json")).unwrap();
}
