//! Shared, read-only state of the HTTP app.

use std::collections::BTreeMap;
use std::sync::Arc;

use hearth_engine::{ChatModel, EmbedModel};
use hearth_store::Store;

use crate::models_resolve::{AdapterModel, SharedAdapterSource};

#[derive(Clone)]
pub struct AppState {
    /// Chat models served, by catalogue id.
    pub chat: Arc<BTreeMap<String, ChatModel>>,
    /// LoRA adapters of the catalogue served as chat models, by id (each
    /// runs on its base in `chat`).
    pub adapters: Arc<BTreeMap<String, AdapterModel>>,
    /// Adapter models beyond the catalogue (fine-tuned models), consulted
    /// for names nothing else serves; `None`: none.
    pub adapter_source: Option<SharedAdapterSource>,
    /// Embedding models served (embeddings, and rerank as bi-encoders), by catalogue id.
    pub embed: Arc<BTreeMap<String, EmbedModel>>,
    /// Extra keys accepted as `Authorization: Bearer KEY` for the default
    /// project, besides the keys in the store.
    pub api_keys: Arc<Vec<String>>,
    /// When the server started (seconds since the epoch), shown as `created` of models.
    pub started_at: u64,
    /// Projects, accounts, keys and files.
    pub store: Store,
    /// The default project (of the extra keys).
    pub default_project: Arc<str>,
    /// Largest file upload, in bytes.
    pub max_upload_bytes: u64,
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
