//! Shared helpers of hearth-jobs' integration tests: where the real default
//! model lives (as in hearth-engine's tests), and tiny random Llama models
//! written to disk in both layouts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};
use hearth_engine::catalog::Catalog;
use hearth_engine::pull::{self, Progress};
use hearth_models::{Llama, LlamaConfig};

/// The repository's `data/models` folder, the same place `hearth serve`
/// uses by default (`HEARTH_TEST_DATA_DIR` overrides `data`).
fn models_dir() -> PathBuf {
    std::env::var_os("HEARTH_TEST_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data"))
        .join("models")
}

/// Pulls catalogue model `id` (once, sha256-checked) into [`models_dir`];
/// returns its catalogue entry's folder and weights file.
fn pulled(id: &str) -> (PathBuf, PathBuf) {
    let models = models_dir();
    let catalog = Catalog::built_in();
    let entry = catalog
        .get(id)
        .unwrap_or_else(|| panic!("{id} is in the catalogue"));
    let dir = pull::ensure(entry, &models, Progress::Quiet)
        .unwrap_or_else(|e| panic!("cannot fetch {id}: {e}"));
    (dir, entry.weights_path(&models))
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF (the default chat model).
pub fn smollm_gguf() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| pulled("HuggingFaceTB/SmolLM2-135M-Instruct").1)
        .clone()
}

pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const LAYERS: usize = 2;
pub const VOCAB: usize = 100;
pub const CONTEXT: usize = 48;
pub const FF: usize = 96;
const THETA: f64 = 100000.0;

pub fn config_json() -> serde_json::Value {
    serde_json::json!({
        "hidden_size": HIDDEN, "intermediate_size": FF, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": THETA, "max_position_embeddings": CONTEXT,
        "vocab_size": VOCAB, "tie_word_embeddings": false,
    })
}

/// llama.cpp's converter permutation of q/k rows (HF halves -> adjacent pairs).
fn permute(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (out, inp) = w.dims2()?;
    w.reshape((heads, 2, out / heads / 2, inp))?
        .transpose(1, 2)?
        .reshape((out, inp))
}

fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
    let (layer, rest) = rest.split_once('.').unwrap();
    let part = match rest {
        "input_layernorm.weight" => "attn_norm",
        "post_attention_layernorm.weight" => "ffn_norm",
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        other => panic!("unmapped {other}"),
    };
    format!("blk.{layer}.{part}.weight")
}

/// A tiny random Llama written to `dir` as a Hugging Face folder
/// (`config.json`, `model.safetensors`) and as `dir/tiny.gguf` (f32
/// tensors, q/k permuted like llama.cpp's converter). Returns the two
/// inference models (`hearth_models::Llama`, f32 KV cache).
pub fn write_tiny(dir: &Path) -> anyhow::Result<(Llama, Llama)> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let scale = Init::Randn {
        mean: 1.0,
        stdev: 0.2,
    };
    vb.get_with_hints(HIDDEN, "model.norm.weight", scale)?;
    for i in 0..LAYERS {
        for n in ["input_layernorm", "post_attention_layernorm"] {
            vb.get_with_hints(HIDDEN, &format!("model.layers.{i}.{n}.weight"), scale)?;
        }
    }
    vb.get_with_hints(
        (VOCAB, HIDDEN),
        "lm_head.weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    let cfg: LlamaConfig = serde_json::from_value(config_json())?;
    let hf = Llama::from_safetensors(&cfg, vb)?.with_kv_dtype(DType::F32)?;
    varmap.save(dir.join("model.safetensors"))?;
    std::fs::write(dir.join("config.json"), config_json().to_string())?;

    let mut tensors = Vec::new();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let g = gguf_name(name);
        let t = var.as_tensor().clone();
        let stored = if g.ends_with("attn_q.weight") {
            permute(&t, HEADS)?
        } else if g.ends_with("attn_k.weight") {
            permute(&t, KV_HEADS)?
        } else {
            t
        };
        tensors.push((g, QTensor::quantize(&stored, GgmlDType::F32)?));
    }
    let u32v = |v: usize| Value::U32(v as u32);
    let metadata = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.context_length", u32v(CONTEXT)),
        ("llama.embedding_length", u32v(HIDDEN)),
        ("llama.block_count", u32v(LAYERS)),
        ("llama.feed_forward_length", u32v(FF)),
        ("llama.attention.head_count", u32v(HEADS)),
        ("llama.attention.head_count_kv", u32v(KV_HEADS)),
        ("llama.rope.dimension_count", u32v(HIDDEN / HEADS)),
        ("llama.rope.freq_base", Value::F32(THETA as f32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let path = dir.join("tiny.gguf");
    let mut file = std::fs::File::create(&path)?;
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md, &ts)?;
    drop(file);
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let gg = Llama::from_gguf_with(&content, &mut file, &dev, false)?.with_kv_dtype(DType::F32)?;
    Ok((hf, gg))
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A fresh SQLite store with its blobs in `dir`, and its default project.
pub async fn open_store(dir: &Path) -> (hearth_store::Store, String) {
    let store = hearth_store::Store::open(&hearth_store::StoreConfig {
        data_dir: dir.to_path_buf(),
        database_url: None,
        blob_url: None,
    })
    .await
    .unwrap();
    let project = store.default_project().await.unwrap().id;
    (store, project)
}
