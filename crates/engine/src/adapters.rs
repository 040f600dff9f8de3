//! The LoRA adapters an engine has loaded: a bounded LRU keyed by a stable
//! adapter key (a catalogue id, a fine-tuned model name...).
//!
//! Adapters are loaded lazily, the first time a request names them, through
//! a loader callback that returns PEFT's two files ([`PeftFiles`]) from
//! wherever they live (a folder, the Hub, a blob store). The files are
//! parsed, checked against the base model ([`LoraSpec::prepare`]: shapes,
//! q/k permutation for a GGUF base) and kept as `Arc<LoraAdapter>`s.
//! Concurrent requests for the same key wait on one load. When more than
//! `capacity` adapters are loaded the least recently used is dropped from
//! the cache; sequences still running with it hold their own `Arc`, so it
//! stays alive until they finish.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use hearth_models::{LoraAdapter, LoraSpec};
use tokio::sync::OnceCell;

/// PEFT's two adapter files: `adapter_model.safetensors` and
/// `adapter_config.json`.
#[derive(Debug, Clone)]
pub struct PeftFiles {
    pub weights: Vec<u8>,
    pub config: String,
}

impl PeftFiles {
    /// Reads the two files from a folder.
    pub fn read_dir(dir: &std::path::Path) -> anyhow::Result<Self> {
        use hearth_models::lora::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
        let read = |name: &str| {
            std::fs::read(dir.join(name))
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.join(name).display()))
        };
        Ok(Self {
            weights: read(ADAPTER_WEIGHTS_FILE)?,
            config: String::from_utf8(read(ADAPTER_CONFIG_FILE)?)?,
        })
    }
}

/// What a loader returns.
pub type LoadFuture = Pin<Box<dyn Future<Output = anyhow::Result<PeftFiles>> + Send>>;

/// Fetches an adapter's files; called at most once per load.
pub type AdapterLoader = Arc<dyn Fn() -> LoadFuture + Send + Sync>;

/// A loader reading a local PEFT folder.
pub fn dir_loader(dir: std::path::PathBuf) -> AdapterLoader {
    Arc::new(move || -> LoadFuture {
        let dir = dir.clone();
        Box::pin(
            async move { tokio::task::spawn_blocking(move || PeftFiles::read_dir(&dir)).await? },
        )
    })
}

/// A loaded adapter and the key it was loaded under.
#[derive(Debug, Clone)]
pub struct LoadedAdapter {
    pub key: Arc<str>,
    pub adapter: Arc<LoraAdapter>,
}

struct Entry {
    cell: Arc<OnceCell<Arc<LoraAdapter>>>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Arc<str>, Entry>,
    tick: u64,
}

/// The adapters of one base model (see the module docs).
pub struct AdapterCache {
    spec: Option<LoraSpec>,
    capacity: usize,
    inner: Mutex<Inner>,
}

/// Default number of adapters kept loaded per engine.
pub const DEFAULT_MAX_ADAPTERS: usize = 8;

impl AdapterCache {
    /// `spec` is the base model's ([`hearth_models::CausalLM::lora_spec`]);
    /// `None` refuses every adapter.
    pub fn new(spec: Option<LoraSpec>, capacity: usize) -> Self {
        Self {
            spec,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Parses and checks PEFT files against the base without caching them.
    pub fn prepare(&self, files: &PeftFiles) -> anyhow::Result<LoraAdapter> {
        prepare_files(self.spec.as_ref(), files)
    }

    /// The adapter loaded under `key`, loading it through `loader` first if
    /// needed (one load at a time per key; a failed load is retried by the
    /// next call).
    pub async fn get(&self, key: &str, loader: &AdapterLoader) -> anyhow::Result<LoadedAdapter> {
        let (key, cell) = {
            let mut inner = self.inner.lock().expect("adapter cache lock");
            inner.tick += 1;
            let tick = inner.tick;
            let key: Arc<str> = match inner.entries.get_key_value(key) {
                Some((k, _)) => k.clone(),
                None => Arc::from(key),
            };
            let entry = inner.entries.entry(key.clone()).or_insert_with(|| Entry {
                cell: Arc::new(OnceCell::new()),
                last_used: tick,
            });
            entry.last_used = tick;
            (key, entry.cell.clone())
        };
        let result = cell
            .get_or_try_init(|| async {
                let files = loader().await?;
                tracing::info!(adapter = %key, "loading LoRA adapter");
                let spec = self.spec.clone();
                tokio::task::spawn_blocking(move || {
                    prepare_files(spec.as_ref(), &files).map(Arc::new)
                })
                .await?
            })
            .await
            .cloned();
        let mut inner = self.inner.lock().expect("adapter cache lock");
        match result {
            Ok(adapter) => {
                self.evict(&mut inner, &key);
                Ok(LoadedAdapter { key, adapter })
            }
            Err(e) => {
                if let Some(entry) = inner.entries.get(&key) {
                    if Arc::ptr_eq(&entry.cell, &cell) && !cell.initialized() {
                        inner.entries.remove(&key);
                    }
                }
                Err(e)
            }
        }
    }

    /// The adapter under `key` if it is loaded (marks it used).
    pub fn peek(&self, key: &str) -> Option<LoadedAdapter> {
        let mut inner = self.inner.lock().expect("adapter cache lock");
        inner.tick += 1;
        let tick = inner.tick;
        let (k, entry) = inner.entries.get_key_value(key)?;
        let adapter = entry.cell.get()?.clone();
        let k = k.clone();
        inner.entries.get_mut(key)?.last_used = tick;
        Some(LoadedAdapter { key: k, adapter })
    }

    /// Keys of the loaded adapters (most recently used first).
    pub fn loaded(&self) -> Vec<Arc<str>> {
        let inner = self.inner.lock().expect("adapter cache lock");
        let mut v: Vec<(&Arc<str>, &Entry)> = inner
            .entries
            .iter()
            .filter(|(_, e)| e.cell.initialized())
            .collect();
        v.sort_by_key(|(_, e)| std::cmp::Reverse(e.last_used));
        v.into_iter().map(|(k, _)| k.clone()).collect()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops least recently used loaded adapters beyond the capacity (never
    /// `keep`, never one still loading).
    fn evict(&self, inner: &mut Inner, keep: &Arc<str>) {
        loop {
            let loaded = inner
                .entries
                .values()
                .filter(|e| e.cell.initialized())
                .count();
            if loaded <= self.capacity {
                return;
            }
            let victim = inner
                .entries
                .iter()
                .filter(|(k, e)| e.cell.initialized() && *k != keep)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    tracing::info!(adapter = %k, "unloading LoRA adapter (cache full)");
                    inner.entries.remove(&k);
                }
                None => return,
            }
        }
    }
}

/// Parses PEFT files and checks them against a base's shapes (target
/// modules, rank, every A and B; what [`AdapterCache::prepare`] does),
/// returning the adapter in Hugging Face layout as read.
pub fn check_files(spec: &LoraSpec, files: &PeftFiles) -> anyhow::Result<LoraAdapter> {
    let adapter = LoraAdapter::from_peft(&files.weights, &files.config, spec.info.num_layers)
        .map_err(|e| anyhow::anyhow!("invalid adapter: {e}"))?;
    adapter
        .check_shapes(&spec.info, spec.intermediate_size)
        .map_err(|e| anyhow::anyhow!("adapter does not fit the base model: {e}"))?;
    Ok(adapter)
}

/// The shapes an adapter of the catalogue chat model `entry` must fit,
/// read from its files' metadata (the GGUF header, or `config.json`)
/// without loading its weights. The files must be present (pulled).
pub fn base_lora_spec(
    entry: &crate::catalog::CatalogEntry,
    models_dir: &std::path::Path,
) -> anyhow::Result<LoraSpec> {
    use crate::catalog::{ModelKind, WeightFormat};
    anyhow::ensure!(
        entry.kind == ModelKind::Chat,
        "`{}` is not a chat model (its kind is `{}`): only chat models take adapters",
        entry.id,
        entry.kind.as_str()
    );
    anyhow::ensure!(
        entry.is_present(models_dir),
        "`{}` is not pulled into {} (run `hearth models pull {}`)",
        entry.id,
        models_dir.display(),
        entry.id
    );
    match entry.format {
        WeightFormat::Gguf => {
            let path = entry.weights_path(models_dir);
            let mut file = std::fs::File::open(&path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
            let content = candle_core::quantized::gguf_file::Content::read(&mut file)
                .map_err(|e| anyhow::anyhow!("{} is not a valid GGUF file: {e}", path.display()))?;
            Ok(hearth_models::lora_spec_from_gguf(&content)?)
        }
        WeightFormat::Safetensors => {
            let path = entry.dir(models_dir).join("config.json");
            let text = std::fs::read(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            let config: hearth_models::LlamaConfig = serde_json::from_slice(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Ok(config.lora_spec())
        }
    }
}

fn prepare_files(spec: Option<&LoraSpec>, files: &PeftFiles) -> anyhow::Result<LoraAdapter> {
    let Some(spec) = spec else {
        anyhow::bail!("this model does not take LoRA adapters")
    };
    let adapter = LoraAdapter::from_peft(&files.weights, &files.config, spec.info.num_layers)
        .map_err(|e| anyhow::anyhow!("invalid adapter: {e}"))?;
    spec.prepare(&adapter)
        .map_err(|e| anyhow::anyhow!("adapter does not fit the base model: {e}"))
}

/// The prefix-cache salt of sequences run with adapter `key` on an engine
/// whose base salt is `base`: blocks computed with different adapters (or
/// none) never share hashes.
pub(crate) fn adapter_salt(base: u64, key: Option<&str>) -> u64 {
    salted(base, "lora", key)
}

/// The prefix-cache salt of a request's cache scope (its project): tenants
/// never share cached blocks.
pub(crate) fn scope_salt(base: u64, scope: Option<&str>) -> u64 {
    salted(base, "scope", scope)
}

/// `base` mixed with `value` under `tag`; `base` itself when there is none.
fn salted(base: u64, tag: &str, value: Option<&str>) -> u64 {
    match value {
        None => base,
        Some(v) => {
            let mut h = DefaultHasher::new();
            base.hash(&mut h);
            tag.hash(&mut h);
            v.hash(&mut h);
            h.finish()
        }
    }
}
