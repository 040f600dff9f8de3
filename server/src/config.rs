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

// One value per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pull the models to serve (if missing), then serve the HTTP API.
    Serve(ServeArgs),
    /// Inspect and fetch models of the catalogue.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Create, list and revoke API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Create and list projects.
    #[command(subcommand)]
    Projects(ProjectsCommand),
    /// List, create and delete dedicated endpoints (a running server
    /// loads and drops their replicas within seconds).
    #[command(subcommand)]
    Endpoints(EndpointsCommand),
    /// Service accounts, their authorized keys and groups (the cloud API's
    /// identities).
    #[command(subcommand)]
    Iam(crate::iam_cli::IamCommand),
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
    /// Register a PEFT LoRA adapter folder (adapter_config.json and
    /// adapter_model.safetensors) for a project, after checking it against
    /// the base model; prints the model name requests use.
    ImportAdapter(ImportAdapterArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ImportAdapterArgs {
    /// The PEFT folder.
    pub path: PathBuf,
    /// The catalogue id of the chat model it adapts (pulled), e.g.
    /// HuggingFaceTB/SmolLM2-135M-Instruct.
    #[arg(long)]
    pub base: String,
    /// 1 to 64 letters, digits, `-`, `_` or `.`; unique in the project.
    #[arg(long)]
    pub name: String,
    /// The project that may use it (default: the default project).
    #[arg(long)]
    pub project: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub db: DbArgs,
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
    /// Extra API keys, for the default project, besides the stored ones
    /// (`hearth keys`); repeatable.
    #[arg(
        long = "api-key",
        env = "HEARTH_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
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
    /// Device the models run on: `cpu`, `cuda`, `cuda:N`, `metal[:N]` or
    /// `auto` (the first CUDA device when the binary was built with the
    /// `cuda` feature and one is present, else the CPU).
    #[arg(long, env = "HEARTH_DEVICE", default_value = "auto")]
    pub device: hearth_engine::DeviceSpec,
    /// Size of each chat model's paged KV cache pool in MiB. Default: 256
    /// MiB on the CPU; on a GPU, what `--gpu-memory-fraction` leaves; always
    /// at least one full context.
    #[arg(long, env = "HEARTH_KV_CACHE_MB")]
    pub kv_cache_mb: Option<usize>,
    /// On a GPU without `--kv-cache-mb`: the share of the device's memory
    /// that the weights and the KV pool take together (each chat model's
    /// pool is sized from what is free once its weights are loaded).
    #[arg(long, env = "HEARTH_GPU_MEMORY_FRACTION", default_value_t = hearth_engine::engine::DEFAULT_GPU_MEMORY_FRACTION, value_parser = parse_fraction)]
    pub gpu_memory_fraction: f64,
    /// Image requests that may wait behind the one an image model is
    /// generating; more are refused with 529.
    #[arg(long, env = "HEARTH_MAX_IMAGE_QUEUE", default_value_t = 8)]
    pub max_image_queue: usize,
    /// Most memory (MiB) the largest attention of one image-model pass may
    /// hold: it grows with the square of the image's area, so this bounds
    /// the image sizes accepted (the default lets Stable Diffusion 1.x make
    /// 832x832 on a CPU, 1024x1024 in f16 on a GPU).
    #[arg(long, env = "HEARTH_IMAGE_MAX_ATTENTION_MB", default_value_t = hearth_engine::image::DEFAULT_MAX_ATTENTION_MB)]
    pub image_max_attention_mb: u64,
    /// LoRA adapters each chat model keeps loaded (least recently used ones
    /// are unloaded beyond it). Also `--max-loaded-adapters`.
    #[arg(
        long,
        alias = "max-loaded-adapters",
        env = "HEARTH_MAX_ADAPTERS",
        default_value_t = 8
    )]
    pub max_adapters: usize,
    /// Most tokens an embedding model encodes in one forward pass; concurrent
    /// embedding and rerank requests are packed into batches under it.
    #[arg(long, env = "HEARTH_MAX_BATCH_TOKENS", default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Arithmetic of the embedding and rerank models' dense layers on the
    /// CPU: `f32`, `bf16` (inputs rounded to bf16, sums in f32: twice the
    /// multiply-adds per instruction; needs AVX-512 BF16), `int16` (inputs
    /// rounded to 12- and 13-bit integers with per-output and per-row
    /// scales, exact integer sums; needs AVX2 and FMA), or `auto` (bf16 on
    /// AMX-BF16 tiles or on non-Intel CPUs with AVX-512 BF16, else int16 on
    /// x86 CPUs with AVX2 and FMA, else f32).
    #[arg(long, env = "HEARTH_ENCODER_PRECISION", default_value = "auto")]
    pub encoder_precision: hearth_engine::EncoderPrecision,
    /// Most tokens a chat model runs in one step over all its sequences:
    /// each decoding sequence takes one, prompts share the rest (a long
    /// prompt is split over several steps so running streams keep flowing).
    #[arg(long, env = "HEARTH_MAX_STEP_TOKENS", default_value_t = 512)]
    pub max_step_tokens: usize,
    /// On the CPU, make every sequence's logits (so its greedy tokens) the
    /// same bits whichever other sequences share its steps (GPUs: not
    /// covered). On CPUs with AVX-512 VNNI, Q4_K, Q5_K and Q6_K weights
    /// then take one activation scale per 256 values in decode steps too
    /// (decode of such models 6-8% slower); other formats, and every format
    /// on other CPUs, are so already. `HEARTH_BATCH_INVARIANT` takes
    /// `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`.
    #[arg(long, env = "HEARTH_BATCH_INVARIANT",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub batch_invariant: bool,
    /// Milliseconds a chat step may spend on batch requests (the tokens that
    /// fit at the measured cost per token; none beside an interactive
    /// prompt): about the most an interactive request waits behind a batch.
    #[arg(long, env = "HEARTH_BATCH_STEP_MS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_step_ms: u64,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Largest file upload, in MiB (larger ones get 413).
    #[arg(long, env = "HEARTH_MAX_UPLOAD_MB", default_value_t = 512)]
    pub max_upload_mb: u64,
    #[command(flatten)]
    pub ft: FineTuneArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
    #[command(flatten)]
    pub datasets: DatasetArgs,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
    #[command(flatten)]
    pub node: crate::nodes::NodeArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// Per-request limits (each refusal is a 4xx in the API's error shapes).
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Most sequences one completion or chat request may start (prompts x
    /// `n`); always kept below `--max-waiting`.
    #[arg(long, env = "HEARTH_MAX_CHOICES", default_value_t = 64)]
    pub max_choices: usize,
    /// Longest stop string, in bytes.
    #[arg(long, env = "HEARTH_MAX_STOP_BYTES", default_value_t = 256)]
    pub max_stop_bytes: usize,
    /// Most bytes of prompt text per request (all prompts or messages
    /// together), refused before tokenizing.
    #[arg(long, env = "HEARTH_MAX_PROMPT_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_prompt_bytes: usize,
    /// Training-file checks (fine-tuning job creation) run at once; more
    /// wait their turn.
    #[arg(long, env = "HEARTH_MAX_VALIDATIONS", default_value_t = 2)]
    pub max_validations: usize,
}

impl Default for LimitArgs {
    fn default() -> Self {
        Self {
            max_choices: 64,
            max_stop_bytes: 256,
            max_prompt_bytes: 2 * 1024 * 1024,
            max_validations: 2,
        }
    }
}

/// The HTTP server's connection handling and cross-origin access.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Seconds a client may take to send a request's headers (also how long
    /// an idle keep-alive connection is kept).
    #[arg(long, env = "HEARTH_HEADER_TIMEOUT_SECS", default_value_t = 30)]
    pub header_timeout_secs: u64,
    /// Seconds a request body may go without sending data.
    #[arg(long, env = "HEARTH_BODY_TIMEOUT_SECS", default_value_t = 60)]
    pub body_timeout_secs: u64,
    /// Whole-request limit, in seconds, of the routes that do not generate,
    /// upload or download (listings, retrievals, admin, embeddings).
    #[arg(long, env = "HEARTH_REQUEST_TIMEOUT_SECS", default_value_t = 300)]
    pub request_timeout_secs: u64,
    /// Requests handled at once; more are answered 503 at once.
    #[arg(long, env = "HEARTH_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,
    /// On SIGTERM or ctrl-c: seconds to let running requests finish before
    /// the server exits anyway.
    #[arg(long, env = "HEARTH_SHUTDOWN_TIMEOUT_SECS", default_value_t = 30)]
    pub shutdown_timeout_secs: u64,
    /// Origins allowed to call the API from a browser (CORS), e.g.
    /// `https://console.example.com`, or `*` for any; repeatable. None by default.
    #[arg(
        long = "cors-origin",
        env = "HEARTH_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Serve `/metrics` without an API key.
    #[arg(long, env = "HEARTH_METRICS_PUBLIC")]
    pub metrics_public: bool,
    /// The server's address as clients reach it (e.g. behind a proxy:
    /// `https://llm.example.com`), used in download links; default: taken
    /// from the request's `Host` header.
    #[arg(long, env = "HEARTH_PUBLIC_URL")]
    pub public_url: Option<String>,
}

impl Default for HttpArgs {
    fn default() -> Self {
        Self {
            header_timeout_secs: 30,
            body_timeout_secs: 60,
            request_timeout_secs: 300,
            max_concurrent_requests: 1024,
            shutdown_timeout_secs: 30,
            cors_origins: Vec::new(),
            metrics_public: false,
            public_url: None,
        }
    }
}

/// The fine-tuning worker of this node.
#[derive(Debug, Clone, Args)]
pub struct FineTuneArgs {
    /// Fine-tuning jobs trained at once on this node; 0 runs no worker
    /// (jobs wait for another node sharing the database).
    #[arg(long, env = "HEARTH_FT_JOBS", default_value_t = 1)]
    pub ft_jobs: usize,
    /// Threads per training job (they run at a lower CPU priority than
    /// serving); default: the machine's cores.
    #[arg(long, env = "HEARTH_FT_THREADS", default_value_t = default_ft_threads())]
    pub ft_threads: usize,
    /// Optimizer steps between checkpoints (the end of every epoch and the
    /// last step always get one).
    #[arg(long, env = "HEARTH_FT_CHECKPOINT_STEPS", default_value_t = 20)]
    pub ft_checkpoint_steps: usize,
    /// Longest training time between checkpoints, in minutes: at most this
    /// much work is lost when the process dies.
    #[arg(long, env = "HEARTH_FT_CHECKPOINT_MINUTES", default_value_t = 2.0,
          value_parser = positive_minutes)]
    pub ft_checkpoint_minutes: f64,
    /// Times a job is claimed (its first run and each restart after its
    /// worker died) before it is failed instead of run again.
    #[arg(long, env = "HEARTH_FT_MAX_ATTEMPTS", default_value_t = 3,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub ft_max_attempts: i64,
    /// CPU niceness of the training threads (0..=19).
    #[arg(long, env = "HEARTH_FT_NICE", default_value_t = 19)]
    pub ft_nice: i32,
    /// Longest a training step waits for serving to go idle (seconds);
    /// under constant load a step then runs anyway.
    #[arg(long, env = "HEARTH_FT_YIELD_MAX_SECS", default_value_t = 30)]
    pub ft_yield_max_secs: u64,
}

/// Dataset uploads.
#[derive(Debug, Clone, Args)]
pub struct DatasetArgs {
    /// Most parts one dataset upload may have.
    #[arg(long, env = "HEARTH_DATASET_MAX_PARTS", default_value_t = 10_000,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub dataset_max_parts: i64,
    /// Hours a dataset upload may stay unfinished; then it is cancelled and
    /// its parts deleted (checked at start and every hour).
    #[arg(long, env = "HEARTH_DATASET_UPLOAD_TTL_HOURS", default_value_t = 24,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub dataset_upload_ttl_hours: u64,
    /// URL prefixes (`s3://bucket/prefix/`, `file:///srv/datasets/`) that
    /// dataset imports may read; none by default (imports refused).
    #[arg(
        long = "dataset-import-allow",
        env = "HEARTH_DATASET_IMPORT_ALLOW",
        value_delimiter = ','
    )]
    pub dataset_import_allow: Vec<String>,
}

impl Default for DatasetArgs {
    fn default() -> Self {
        Self {
            dataset_max_parts: 10_000,
            dataset_upload_ttl_hours: 24,
            dataset_import_allow: Vec::new(),
        }
    }
}

impl DatasetArgs {
    /// The policy for a server whose store is `store`.
    pub fn policy(&self, store: &hearth_store::StoreConfig) -> crate::state::DatasetPolicy {
        crate::state::DatasetPolicy {
            max_parts: self.dataset_max_parts,
            upload_ttl: std::time::Duration::from_secs(self.dataset_upload_ttl_hours * 3600),
            import_allow: self.dataset_import_allow.clone().into(),
            private_paths: crate::local_import::LocalPaths::private_of(
                &store.data_dir,
                store.database_url.as_deref(),
                store.blob_url.as_deref(),
            )
            .into(),
            import_wake: Default::default(),
        }
    }
}

/// What this node sets aside for dedicated endpoints.
#[derive(Debug, Clone, Args)]
pub struct EndpointArgs {
    /// Memory dedicated endpoints may reserve in all (weights, KV caches,
    /// working memory of every replica), in MiB; default: 80% of the
    /// memory available when the server starts.
    #[arg(long, env = "HEARTH_ENDPOINT_MEMORY_MB")]
    pub endpoint_memory_mb: Option<u64>,
    /// Threads dedicated endpoints may reserve in all; default: the
    /// host's cores.
    #[arg(long, env = "HEARTH_ENDPOINT_THREADS")]
    pub endpoint_threads: Option<usize>,
    /// Seconds an endpoint above its `min_replicas` must go without
    /// requests before it drops a replica.
    #[arg(long, env = "HEARTH_ENDPOINT_SCALE_DOWN_SECS", default_value_t = 60)]
    pub endpoint_scale_down_secs: u64,
    /// Seconds a replica taken out of service (delete, update, scale-down,
    /// stop) may finish its requests before it is stopped (they then end
    /// with 503).
    #[arg(long, env = "HEARTH_ENDPOINT_DRAIN_SECS", default_value_t = 30)]
    pub endpoint_drain_secs: u64,
    /// Devices endpoint replicas may run on, comma-separated (`cuda:1,cuda:2`);
    /// each new replica goes to the one with the most free memory. Default:
    /// every GPU when models run on a GPU, else the `--device`.
    #[arg(long, env = "HEARTH_ENDPOINT_DEVICES", value_delimiter = ',')]
    pub endpoint_devices: Vec<hearth_engine::DeviceSpec>,
}

impl Default for EndpointArgs {
    fn default() -> Self {
        Self {
            endpoint_memory_mb: None,
            endpoint_threads: None,
            endpoint_scale_down_secs: 60,
            endpoint_devices: Vec::new(),
            endpoint_drain_secs: 30,
        }
    }
}

/// The batch worker of this node.
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// Batches run at once on this node; 0 runs no batch worker (batches
    /// wait for another node sharing the database).
    #[arg(long, env = "HEARTH_BATCH_WORKERS", default_value_t = 2)]
    pub batch_workers: usize,
    /// Batch requests in flight at once on this node, over all its
    /// batches (they run at the engine's batch priority, after interactive
    /// requests).
    #[arg(long, env = "HEARTH_BATCH_MAX_INFLIGHT", default_value_t = 32,
          value_parser = at_least_one)]
    pub batch_max_inflight: usize,
    /// Most requests (lines) a batch's input file may hold.
    #[arg(long, env = "HEARTH_BATCH_MAX_LINES",
          default_value_t = hearth_jobs::batch::DEFAULT_MAX_LINES)]
    pub batch_max_lines: usize,
}

impl Default for BatchArgs {
    fn default() -> Self {
        Self {
            batch_workers: 2,
            batch_max_inflight: 32,
            batch_max_lines: hearth_jobs::batch::DEFAULT_MAX_LINES,
        }
    }
}

/// A count of at least one.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of at least 1")),
    }
}

/// A number of minutes above zero and at most a day.
fn positive_minutes(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(m) if m > 0.0 && m <= 1440.0 => Ok(m),
        _ => Err(format!("`{text}` is not a number of minutes in (0, 1440]")),
    }
}

/// Every core: training threads run at the lowest priority and yield to
/// serving, so a job uses the machine while it is otherwise idle.
fn default_ft_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for FineTuneArgs {
    fn default() -> Self {
        Self {
            ft_jobs: 1,
            ft_threads: default_ft_threads(),
            ft_checkpoint_steps: 20,
            ft_checkpoint_minutes: 2.0,
            ft_max_attempts: 3,
            ft_nice: 19,
            ft_yield_max_secs: 30,
        }
    }
}

/// Where metadata and blobs live, when not under the data folder.
#[derive(Debug, Clone, Default, Args)]
pub struct DbArgs {
    /// Metadata database: `sqlite://PATH` or `postgres://USER:PASS@HOST/DB`
    /// (default: <data-dir>/hearth.db).
    #[arg(long, env = "HEARTH_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Blob store: `file:///PATH` or `s3://BUCKET/PREFIX`, with the usual
    /// AWS_* variables (default: <data-dir>/blobs).
    #[arg(long, env = "HEARTH_BLOB_URL")]
    pub blob_url: Option<String>,
    /// On start, uploaded blobs left without a row (a crash mid-upload) are
    /// removed once this many seconds old; younger ones may be uploads in
    /// progress on another node sharing the store. 0 on a single node.
    #[arg(long, env = "HEARTH_ORPHAN_GRACE_SECS",
          default_value_t = hearth_store::ORPHAN_GRACE.as_secs())]
    pub orphan_grace_secs: u64,
}

impl DbArgs {
    pub fn store_config(&self, data_dir: &std::path::Path) -> hearth_store::StoreConfig {
        hearth_store::StoreConfig {
            data_dir: data_dir.to_path_buf(),
            database_url: self.database_url.clone(),
            blob_url: self.blob_url.clone(),
        }
    }
}

/// The store that `hearth keys` and `hearth projects` work on.
#[derive(Debug, Clone, Args)]
pub struct StoreLocation {
    /// Folder for models and other data.
    #[arg(long, env = "HEARTH_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub db: DbArgs,
}

impl StoreLocation {
    pub fn store_config(&self) -> hearth_store::StoreConfig {
        self.db.store_config(&self.data_dir)
    }
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key (for a new account) and print it once.
    Create {
        /// A name to recognise the key by.
        #[arg(long)]
        name: String,
        /// The project the key reaches (default: the default project).
        #[arg(long)]
        project: Option<String>,
        /// Let the key manage keys and projects over HTTP.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// List keys: names, prefixes, projects, created, last used.
    List(StoreLocation),
    /// Revoke a key; it is refused at once.
    Revoke {
        /// The key's id (`key-...`), as `hearth keys list` shows it.
        id: String,
        #[command(flatten)]
        location: StoreLocation,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProjectsCommand {
    /// Create a project and print its id.
    Create {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// List projects.
    List(StoreLocation),
    /// A project's spending budget (402 once spent).
    #[command(subcommand)]
    Budget(crate::usage_cli::BudgetCommand),
    /// A project's token quotas (429 past them).
    #[command(subcommand)]
    Quota(crate::usage_cli::QuotaCommand),
}

#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// List the dedicated endpoints of every project.
    List(StoreLocation),
    /// Create a dedicated endpoint; prints its id and routing key. The
    /// server checks that the flavor fits when it loads it (a misfit ends
    /// `failed` with the reason).
    Create {
        #[arg(long)]
        name: String,
        /// A template's model name (see GET /v0/dedicated_endpoints/templates).
        #[arg(long)]
        model: String,
        /// A flavor of that template, e.g. cpu-large.
        #[arg(long)]
        flavor: String,
        /// Replicas kept loaded.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
        replicas: u32,
        /// Project (default: the default project).
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Delete a dedicated endpoint (its replicas stop once their requests
    /// are done).
    Delete {
        id: String,
        #[command(flatten)]
        location: StoreLocation,
    },
}

/// A share in (0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("`{s}` is not a fraction in (0, 1]")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use hearth_engine::DeviceSpec;

    #[derive(Parser)]
    struct Endpoints {
        #[command(flatten)]
        args: super::EndpointArgs,
    }

    #[test]
    fn endpoint_devices_are_a_comma_separated_list() {
        let parse = |args: &[&str]| Endpoints::try_parse_from(args).map(|e| e.args);
        let e = parse(&["t", "--endpoint-devices", "cuda:1,cuda:2"]).unwrap();
        assert_eq!(
            e.endpoint_devices,
            [DeviceSpec::Cuda(1), DeviceSpec::Cuda(2)]
        );
        assert!(parse(&["t"]).unwrap().endpoint_devices.is_empty());
        let err = parse(&["t", "--endpoint-devices", "cuda:1,tpu"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown device `tpu`"), "{err}");
    }
}
