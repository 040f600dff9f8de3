//! Shared, read-only state of the HTTP app.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hearth_engine::{ChatModel, EmbedModel};
use hearth_store::Store;

use crate::limits::Limits;
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
    /// Image models served (`/v1/images/generations`), by catalogue id.
    pub images: Arc<BTreeMap<String, hearth_engine::image::ImageModel>>,
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
    /// Per-request limits of the generation routes.
    pub limits: Limits,
    /// How the HTTP side presents itself.
    pub http: HttpPolicy,
    /// Requests this node's batch worker ran (for `/metrics`).
    pub batch_counters: Arc<hearth_jobs::batch::BatchCounters>,
    /// Limits of dataset uploads.
    pub datasets: DatasetPolicy,
    /// This node's dedicated endpoints (empty and unable to start any on
    /// a state built without models).
    pub endpoints: crate::endpoints::Endpoints,
    /// Usage metering, token quotas and budgets.
    pub usage: crate::usage::Ledger,
    /// This node's id in the store's registry of nodes, and the timeout
    /// after which a silent node is gone.
    pub node: crate::nodes::NodeIdentity,
}

impl AppState {
    /// The ids of the models this node loaded: chat, adapters of the
    /// catalogue, embedding and image models (not fine-tuned adapters or
    /// endpoint routing keys, found per request).
    pub fn local_models(&self) -> impl Iterator<Item = &String> {
        self.chat
            .keys()
            .chain(self.adapters.keys())
            .chain(self.embed.keys())
            .chain(self.images.keys())
    }
}

/// Limits of dataset uploads.
#[derive(Clone, Debug)]
pub struct DatasetPolicy {
    /// Most parts one upload may have.
    pub max_parts: i64,
    /// How long an upload may stay `PENDING` before it is cancelled and
    /// its parts deleted.
    pub upload_ttl: std::time::Duration,
    /// URL prefixes imports from object storage may read; empty: none.
    pub import_allow: Arc<[String]>,
    /// The server's own files, which no `file://` import reads whatever
    /// the prefixes allow (`crate::local_import`).
    pub private_paths: Arc<[std::path::PathBuf]>,
    /// Wakes this node's import worker (`crate::dataset_imports`) when an
    /// import is queued.
    pub import_wake: Arc<tokio::sync::Notify>,
}

impl Default for DatasetPolicy {
    fn default() -> Self {
        Self {
            max_parts: 10_000,
            upload_ttl: std::time::Duration::from_secs(24 * 3600),
            import_allow: Arc::from(Vec::new()),
            private_paths: Arc::from(Vec::new()),
            import_wake: Default::default(),
        }
    }
}

/// The HTTP side's settings that handlers read.
#[derive(Clone, Default)]
pub struct HttpPolicy {
    /// `/metrics` without a key.
    pub metrics_public: bool,
    /// Base of the links the server hands out (`--public-url`), without a
    /// trailing `/`; `None`: from the request's `Host`.
    pub public_url: Option<Arc<str>>,
    /// Set once shutdown began: readiness then fails.
    pub draining: Arc<AtomicBool>,
    /// Origins allowed by CORS (`*`: any); empty: no CORS headers.
    pub cors_origins: Arc<[String]>,
    /// Requests handled at once (0: no limit); the rest get 503.
    pub max_concurrent: usize,
    /// Whole-request limit of the routes that neither generate nor stream
    /// files.
    pub request_timeout: Option<std::time::Duration>,
    /// Idle limit between the frames of a request body.
    pub body_timeout: Option<std::time::Duration>,
}

impl HttpPolicy {
    pub fn new(args: &crate::config::HttpArgs) -> Self {
        Self {
            metrics_public: args.metrics_public,
            public_url: args
                .public_url
                .as_deref()
                .map(|u| u.trim_end_matches('/').into()),
            draining: Arc::default(),
            cors_origins: args.cors_origins.clone().into(),
            max_concurrent: args.max_concurrent_requests,
            request_timeout: Some(std::time::Duration::from_secs(args.request_timeout_secs)),
            body_timeout: Some(std::time::Duration::from_secs(args.body_timeout_secs)),
        }
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
