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
pub fn write_model(dir: &Path, config: &serde_json::Value, tokenizer: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let parsed: EncoderConfig = serde_json::from_value(config.clone()).unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    parsed.load_cross_encoder(vb).unwrap();
    // `VarBuilder::get` creates zeros: give every weight random values.
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let scale = if name.contains("LayerNorm") { 0.1 } else { 0.5 };
        let noise = Tensor::randn(0f32, scale, var.shape(), &Device::Cpu).unwrap();
        let value = if name.contains("LayerNorm.weight") {
            (noise + 1.0).unwrap()
        } else {
            noise
        };
        var.set(&value).unwrap();
    }
    varmap.save(dir.join("model.safetensors")).unwrap();
    std::fs::copy(tokenizer, dir.join("tokenizer.json")).unwrap();
}
