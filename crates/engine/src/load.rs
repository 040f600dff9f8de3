//! Loading a catalogue model into a running engine.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::grammar::GrammarCompiler;

use candle_core::quantized::gguf_file;
use candle_core::Device;
use hearth_models::{CausalLM, Llama, LlamaConfig};
use tokenizers::Tokenizer;

use crate::catalog::{CatalogEntry, ModelKind, WeightFormat};
use crate::chat_template::ChatTemplate;
use crate::engine::{EngineConfig, EngineHandle, EngineParts};
use crate::tokenizer::{gguf_tokenizer_meta, tokenizer_from_file, tokenizer_from_gguf};

/// A chat model ready to serve: its engine plus what handlers need to turn
/// requests into token ids.
#[derive(Clone)]
pub struct ChatModel {
    pub entry: CatalogEntry,
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// Structured output's grammar compiler, built on first use.
    grammar: Arc<OnceLock<Result<Arc<GrammarCompiler>, String>>>,
    /// The end-of-sequence token a finished grammar allows.
    eos: Option<u32>,
}

/// The pieces of a causal LM read from disk, before the engine starts.
pub struct LoadedLm {
    pub model: Box<dyn CausalLM>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub eos_ids: Vec<u32>,
}

/// Reads a causal LM from `dir` (the model's folder, or for GGUF the folder
/// holding the file named in the catalogue).
pub fn load_lm(
    entry: &CatalogEntry,
    models_dir: &Path,
    device: &Device,
) -> anyhow::Result<LoadedLm> {
    anyhow::ensure!(
        entry.kind == ModelKind::Chat,
        "model `{}` is not a chat model",
        entry.id
    );
    let mut lm = match entry.format {
        WeightFormat::Gguf => load_gguf(&entry.weights_path(models_dir), device)?,
        WeightFormat::Safetensors => load_safetensors(&entry.dir(models_dir), device)?,
    };
    if let Some(template) = &entry.chat_template {
        lm.template = lm.template.replaced(template).map_err(|e| {
            anyhow::anyhow!("the chat_template of catalogue entry `{}`: {e}", entry.id)
        })?;
    }
    Ok(lm)
}

/// Reads a llama GGUF: weights, tokenizer and chat template from one file.
pub fn load_gguf(path: &Path, device: &Device) -> anyhow::Result<LoadedLm> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    let content = gguf_file::Content::read(&mut file)
        .map_err(|e| anyhow::anyhow!("{} is not a valid GGUF file: {e}", path.display()))?;
    let tokenizer = tokenizer_from_gguf(&content)?;
    let meta = gguf_tokenizer_meta(&content);
    let template = match &meta.chat_template {
        Some(t) => ChatTemplate::new(t, meta.bos_token.clone(), meta.eos_token.clone())?,
        None => ChatTemplate::chatml(),
    };
    let mut eos_ids: Vec<u32> = meta.eos_id.into_iter().collect();
    // Chat templates end turns with these; treat them as end of sequence too.
    for name in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>"] {
        if let Some(id) = tokenizer.token_to_id(name) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    let model = Llama::from_gguf(&content, &mut file, device)?;
    Ok(LoadedLm {
        model: Box::new(model),
        tokenizer,
        template,
        eos_ids,
    })
}

/// Reads a Hugging Face llama folder: config.json, tokenizer.json,
/// tokenizer_config.json (chat template), *.safetensors.
pub fn load_safetensors(dir: &Path, device: &Device) -> anyhow::Result<LoadedLm> {
    let config: LlamaConfig = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
    let tokenizer = tokenizer_from_file(dir.join("tokenizer.json"))?;
    let tok_config: serde_json::Value = std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let special = |key: &str| -> Option<String> {
        match &tok_config[key] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => {
                o.get("content").and_then(|c| c.as_str()).map(String::from)
            }
            _ => None,
        }
    };
    let template = match tok_config["chat_template"].as_str() {
        Some(t) => ChatTemplate::new(t, special("bos_token"), special("eos_token"))?,
        None => ChatTemplate::chatml(),
    };
    let eos_ids = special("eos_token")
        .and_then(|t| tokenizer.token_to_id(&t))
        .into_iter()
        .collect();
    let mut weights: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    weights.sort();
    anyhow::ensure!(
        !weights.is_empty(),
        "no .safetensors files in {}",
        dir.display()
    );
    let dtype = if device.is_cpu() {
        candle_core::DType::F32
    } else {
        candle_core::DType::BF16
    };
    // SAFETY: the files are memory-mapped read-only and not modified while mapped.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&weights, dtype, device)? };
    let model = Llama::from_safetensors(&config, vb)?;
    Ok(LoadedLm {
        model: Box::new(model),
        tokenizer,
        template,
        eos_ids,
    })
}

impl ChatModel {
    /// Loads `entry` and starts its engine.
    pub fn start(
        entry: &CatalogEntry,
        models_dir: &Path,
        device: &Device,
        config: EngineConfig,
    ) -> anyhow::Result<Self> {
        Self::start_merged(entry, models_dir, device, config, None)
    }

    /// [`ChatModel::start`] with `adapter` (prepared for this model by its
    /// [`crate::AdapterCache::prepare`]) folded into the weights: the
    /// engine serves the fine-tuned model as its base, with no per-token
    /// adapter work.
    pub fn start_merged(
        entry: &CatalogEntry,
        models_dir: &Path,
        device: &Device,
        mut config: EngineConfig,
        adapter: Option<&hearth_models::LoraAdapter>,
    ) -> anyhow::Result<Self> {
        let mut lm = load_lm(entry, models_dir, device)?;
        if let Some(adapter) = adapter {
            lm.model.merge_lora(adapter)?;
        }
        if config.kv_cache_bytes.is_none() && device.is_cpu() {
            // On a GPU the engine sizes the pool from the device's free
            // memory (`gpu_memory_fraction`) instead.
            let weights = dir_bytes(&entry.dir(models_dir));
            config.kv_cache_bytes = Some(crate::engine::default_kv_cache_bytes(weights));
        }
        let tokenizer = Arc::new(lm.tokenizer);
        let eos = lm.eos_ids.first().copied();
        let context_length = entry.context_length.min(lm.model.info().context_length);
        let engine = EngineHandle::start(
            EngineParts {
                model: lm.model,
                tokenizer: tokenizer.clone(),
                eos_ids: lm.eos_ids,
                context_length,
            },
            config,
        )?;
        Ok(Self {
            entry: entry.clone(),
            engine,
            tokenizer,
            template: Arc::new(lm.template),
            grammar: Default::default(),
            eos,
        })
    }

    /// The model's grammar compiler (built the first time: it reads the
    /// whole vocabulary, so call it off the async threads).
    pub fn grammar(&self) -> Result<Arc<GrammarCompiler>, String> {
        self.grammar
            .get_or_init(|| {
                let eos = self.eos.ok_or("the model has no end-of-sequence token")?;
                GrammarCompiler::new(&self.tokenizer, eos)
                    .map(Arc::new)
                    .map_err(|e| format!("structured output is not available for this model: {e}"))
            })
            .clone()
    }
}

/// Total size of the files directly in `dir` (0 when unreadable).
pub fn dir_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len() as usize)
                .sum()
        })
        .unwrap_or(0)
}
