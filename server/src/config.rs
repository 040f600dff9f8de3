//! Command-line configuration: one clap struct per command, every flag also
//! readable from an environment variable.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "hearth",
    version,
    about = "Self-hosted inference engine with an OpenAI-compatible API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pull the models to serve (if missing), then serve the HTTP API.
    Serve(ServeArgs),
    /// Inspect and fetch models of the catalogue.
    #[command(subcommand)]
    Models(ModelsCommand),
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// List the catalogue, marking models already pulled.
    List(StoreArgs),
    /// Fetch a model (default: the default models) and check its files.
    Pull {
        /// Catalogue id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct.
        id: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Where models and data live.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Folder for models and other data.
    #[arg(long, env = "HEARTH_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// A catalogue file read on top of the built-in one
    /// (default: <data-dir>/catalog.toml when it exists).
    #[arg(long, env = "HEARTH_CATALOG")]
    pub catalog: Option<PathBuf>,
}

impl StoreArgs {
    pub fn models_dir(&self) -> PathBuf {
        self.data_dir.join("models")
    }

    pub fn catalog_file(&self) -> PathBuf {
        self.catalog
            .clone()
            .unwrap_or_else(|| self.data_dir.join("catalog.toml"))
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "HEARTH_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "HEARTH_PORT", default_value_t = 8000)]
    pub port: u16,
    /// API key clients must send as `Authorization: Bearer KEY`; repeatable.
    /// With none, a key is generated and printed once at start.
    #[arg(long = "api-key", env = "HEARTH_API_KEY", value_delimiter = ',')]
    pub api_keys: Vec<String>,
    /// Catalogue ids of the models to load (default: the catalogue's defaults).
    #[arg(long, env = "HEARTH_MODELS", value_delimiter = ',')]
    pub models: Vec<String>,
    /// Requests that may wait per model before new ones get 529.
    #[arg(long, env = "HEARTH_MAX_WAITING", default_value_t = 256)]
    pub max_waiting: usize,
    /// Most sequences a chat model advances together (admission also waits
    /// for free KV cache blocks).
    #[arg(long, env = "HEARTH_MAX_ACTIVE", default_value_t = 64)]
    pub max_active: usize,
    /// Size of each chat model's paged KV cache pool in MiB. Default: the
    /// larger of 256 MiB and twice the model's weights, and always at least
    /// one full context.
    #[arg(long, env = "HEARTH_KV_CACHE_MB")]
    pub kv_cache_mb: Option<usize>,
    /// Most tokens an embedding model encodes in one forward pass; concurrent
    /// embedding and rerank requests are packed into batches under it.
    #[arg(long, env = "HEARTH_MAX_BATCH_TOKENS", default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Most tokens a chat model runs in one step over all its sequences:
    /// each decoding sequence takes one, prompts share the rest (a long
    /// prompt is split over several steps so running streams keep flowing).
    #[arg(long, env = "HEARTH_MAX_STEP_TOKENS", default_value_t = 512)]
    pub max_step_tokens: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}
