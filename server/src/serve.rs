//! `hearth serve`: pull what is missing, load the models, listen.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use hearth_engine::catalog::{CatalogEntry, ModelKind};
use hearth_engine::pull::{self, Progress};
use hearth_engine::{BatcherConfig, ChatModel, EmbedModel, EngineConfig, PeftFiles};
use hearth_store::Store;

use crate::config::ServeArgs;
use crate::models_resolve::{catalogue_adapter, AdapterModel};
use crate::state::{now_secs, AppState};

/// Builds the app state: pulls and loads the models named in `args`, next to
/// an opened `store` (see [`open_store`]).
pub fn build_state(
    args: &ServeArgs,
    api_keys: Vec<String>,
    store: Store,
    default_project: &str,
) -> anyhow::Result<AppState> {
    let catalog = crate::models_cli::catalog(&args.store)?;
    let mut entries: Vec<CatalogEntry> = if args.models.is_empty() {
        catalog.defaults().cloned().collect()
    } else {
        args.models
            .iter()
            .map(|id| {
                catalog.get(id).cloned().with_context(|| {
                    format!("`{id}` is not in the catalogue (see `hearth models list`)")
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    // An adapter brings its base along.
    for i in 0..entries.len() {
        let Some(base) = entries[i].base.clone() else {
            continue;
        };
        if entries.iter().any(|e| e.id == base) {
            continue;
        }
        let entry = catalog.get(&base).with_context(|| {
            format!(
                "adapter `{}`: its base `{base}` is not in the catalogue",
                entries[i].id
            )
        })?;
        entries.push(entry.clone());
    }
    let models_dir = args.store.models_dir();
    let started_at = now_secs();
    // Before any model runs a product: the kernels fix the choice then.
    if !hearth_kernels::set_batch_invariant(args.batch_invariant) {
        anyhow::bail!("--batch-invariant: the kernels had already run with the other setting");
    }
    let device = args
        .device
        .open()
        .with_context(|| format!("opening device {}", args.device))?;
    tracing::info!(device = %hearth_engine::device::describe(&device), "models run on");
    if args.batch_invariant && device.is_cpu() {
        tracing::info!("batch-invariant: each sequence's logits independent of its step's others");
    } else if args.batch_invariant {
        tracing::warn!("--batch-invariant covers the CPU kernels only: on this device a sequence's outputs may still depend on the others in its steps");
    }
    let config = EngineConfig {
        max_waiting: args.max_waiting,
        max_active: args.max_active,
        max_batch_tokens: args.max_step_tokens,
        kv_cache_bytes: args.kv_cache_mb.map(|mb| mb << 20),
        gpu_memory_fraction: args.gpu_memory_fraction,
        max_adapters: args.max_adapters,
        batch_step_time: std::time::Duration::from_millis(args.batch_step_ms),
        batch_long_quiet: std::time::Duration::from_secs(10),
        threads: None,
    };
    let encoder_config = BatcherConfig {
        max_batch_tokens: args.max_batch_tokens,
        max_waiting: args.max_waiting,
        threads: None,
    };
    let mut chat = BTreeMap::new();
    let mut embed = BTreeMap::new();
    let mut images = BTreeMap::new();
    let image_config = hearth_engine::image::ImageConfig {
        max_waiting: args.max_image_queue,
        max_attention_mb: args.image_max_attention_mb,
    };
    let mut adapter_entries = Vec::new();
    crate::malloc::hold_thresholds();
    for entry in &entries {
        let progress = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            Progress::Bars
        } else {
            Progress::Quiet
        };
        if !entry.is_present(&models_dir) {
            tracing::info!(model = %entry.id, "pulling");
        }
        pull::ensure(entry, &models_dir, progress)
            .with_context(|| format!("pulling {}", entry.id))?;
        match entry.kind {
            ModelKind::Chat => {
                tracing::info!(model = %entry.id, "loading");
                let model = ChatModel::start(entry, &models_dir, &device, config.clone())
                    .with_context(|| format!("loading {}", entry.id))?;
                chat.insert(entry.id.clone(), model);
            }
            ModelKind::Embed | ModelKind::Rerank => {
                tracing::info!(model = %entry.id, "loading");
                let model = EmbedModel::start(
                    entry,
                    &models_dir,
                    &device,
                    encoder_config.clone(),
                    args.encoder_precision,
                )
                .with_context(|| format!("loading {}", entry.id))?;
                tracing::info!(model = %entry.id, precision = model.precision.as_str(), "encoder arithmetic");
                embed.insert(entry.id.clone(), model);
            }
            ModelKind::Image => {
                tracing::info!(model = %entry.id, "loading");
                let model = hearth_engine::image::ImageModel::start(
                    entry,
                    &models_dir,
                    &device,
                    image_config,
                )
                .with_context(|| format!("loading {}", entry.id))?;
                images.insert(entry.id.clone(), model);
            }
            ModelKind::Adapter => adapter_entries.push(entry),
        }
    }
    let mut adapters = BTreeMap::new();
    for entry in adapter_entries {
        let model = load_adapter_entry(entry, &models_dir, &chat, started_at)?;
        adapters.insert(entry.id.clone(), model);
    }
    crate::malloc::after_loading();
    let endpoint_devices =
        hearth_engine::device::endpoint_devices(&device, &args.endpoints.endpoint_devices)?;
    let endpoints = crate::endpoints::Endpoints::new(crate::endpoints::HostConfig {
        models_dir: models_dir.clone(),
        engine: config.clone(),
        encoder: encoder_config.clone(),
        encoder_precision: args.encoder_precision,
        capacity: crate::endpoints::Capacity::from_args(&args.endpoints, &endpoint_devices),
        devices: endpoint_devices,
        scale_down_after: std::time::Duration::from_secs(args.endpoints.endpoint_scale_down_secs),
        drain_deadline: std::time::Duration::from_secs(args.endpoints.endpoint_drain_secs),
    });
    Ok(AppState {
        chat: Arc::new(chat),
        adapters: Arc::new(adapters),
        adapter_source: Some(Arc::new(crate::fine_tuned::FineTunedModels {
            store: store.clone(),
        })),
        embed: Arc::new(embed),
        images: Arc::new(images),
        api_keys: Arc::new(api_keys),
        started_at,
        store,
        default_project: default_project.into(),
        max_upload_bytes: args.max_upload_mb.saturating_mul(1024 * 1024),
        limits: crate::limits::Limits::new(&args.limits, args.max_waiting),
        http: crate::state::HttpPolicy::new(&args.http),
        batch_counters: Default::default(),
        datasets: args
            .datasets
            .policy(&args.db.store_config(&args.store.data_dir)),
        endpoints,
        usage: Default::default(),
        node: args.node.identity(&args.store.data_dir),
    })
}

/// Checks a catalogue adapter against its (loaded) base now, so that a bad
/// adapter fails at startup; it is loaded into the engine on first use.
fn load_adapter_entry(
    entry: &CatalogEntry,
    models_dir: &std::path::Path,
    chat: &BTreeMap<String, ChatModel>,
    created: u64,
) -> anyhow::Result<AdapterModel> {
    let base = entry.base.as_deref().unwrap_or_default();
    let Some(model) = chat.get(base) else {
        anyhow::bail!(
            "adapter `{}`: its base `{base}` is not a served chat model",
            entry.id
        )
    };
    let dir = entry.dir(models_dir);
    let files = PeftFiles::read_dir(&dir).with_context(|| format!("adapter `{}`", entry.id))?;
    let adapter = model
        .engine
        .adapters()
        .prepare(&files)
        .with_context(|| format!("adapter `{}` over `{base}`", entry.id))?;
    tracing::info!(
        model = %entry.id,
        base,
        rank = adapter.config.r,
        params = adapter.num_params(),
        "adapter checked"
    );
    Ok(catalogue_adapter(entry, dir, created))
}

/// Opens the store, sweeps blobs left without a row by a crash (so start
/// one server per store), and on a store without an admin key makes the
/// default project and an admin key, printed once on stdout and never
/// logged. Returns the store and the default project's id.
pub async fn open_store(args: &ServeArgs) -> anyhow::Result<(Store, String)> {
    let config = args.db.store_config(&args.store.data_dir);
    let store = Store::open(&config).await.context("opening the store")?;
    let swept = store
        .sweep_orphan_blobs(std::time::Duration::from_secs(args.db.orphan_grace_secs))
        .await
        .context("sweeping blobs")?;
    if swept > 0 {
        tracing::info!(swept, "removed blobs left by unfinished uploads");
    }
    let project = store.default_project().await?;
    if let Some(admin) = store.bootstrap_admin().await? {
        println!(
            "Created an admin API key for the default project {} (shown once, keep it):\n\n    {}\n",
            project.id, admin.secret
        );
    }
    Ok((store, project.id))
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let keys: Vec<String> = args
        .api_keys
        .iter()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    // A taken address fails now, not after the models' minutes of pulling
    // and loading (the address is bound for good once they are loaded: no
    // connection waits on a server that cannot answer yet).
    let cannot_listen = || format!("cannot listen on {}:{}", args.host, args.port);
    drop(std::net::TcpListener::bind((args.host, args.port)).with_context(cannot_listen)?);
    let (store, default_project) = open_store(&args).await?;
    let state = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || build_state(&args, keys, store, &default_project))
            .await??
    };
    let bases: Vec<_> = state
        .chat
        .values()
        .map(|m| {
            let path = m.entry.weights_path(&args.store.models_dir());
            (m.entry.clone(), path)
        })
        .collect();
    let worker = crate::fine_tuned::start_worker(
        state.store.clone(),
        crate::fine_tuned::trainable_bases(&bases),
        state.chat.clone(),
        &args.ft,
        &state.node,
    );
    let batches = crate::batch_endpoints::start_worker(&state, &args.batch);
    let imports = crate::dataset_imports::spawn(state.clone());
    // Endpoints of the store are registered (503 until loaded) before we
    // listen; their replicas load in the background.
    crate::endpoints::reconcile::reconcile_once(&state).await;
    let reconciler = crate::endpoints::reconcile::spawn(state.clone());
    let meter = state.usage.spawn_flusher(state.store.clone());
    let expiry = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                every.tick().await;
                crate::routes::dataset_uploads::expire_stale(&state).await;
            }
        })
    };
    // Before saying that we listen: a signal from then on is ours.
    let signal = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind((args.host, args.port))
        .await
        .with_context(cannot_listen)?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    println!("Hearth is listening on http://{addr}");
    let heartbeat = crate::nodes::register(&state, &args.node, addr).await;
    let draining = state.http.draining.clone();
    let (usage, store) = (state.usage.clone(), state.store.clone());
    let state_node = state.node.worker_id();
    crate::listen::serve(listener, crate::app::app(state), &args.http, async move {
        signal.await;
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
    })
    .await;
    if let Some(worker) = worker {
        worker.shut_down().await;
    }
    if let Some(batches) = batches {
        batches.shut_down().await;
    }
    imports.stop().await;
    // The endpoints this node ran go to the other nodes at once.
    match store.release_endpoints(&state_node).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(endpoints = n, "dedicated endpoints given back"),
        Err(e) => tracing::warn!("giving the dedicated endpoints back: {e}"),
    }
    heartbeat.stop().await;
    expiry.abort();
    reconciler.abort();
    meter.abort();
    // What the last requests used is written before we exit.
    if let Err(e) = usage.flush(&store).await {
        tracing::warn!("writing the last usage: {e}");
    }
    Ok(())
}

/// Ctrl-c, or SIGTERM on Unix (what `docker stop` and Kubernetes send).
/// The handlers are installed here, at once, so that a signal arriving as
/// soon as the server says it listens is already ours.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let (mut term, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = term.recv() => {},
            _ = interrupt.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down: no new connections; running requests may finish");
    })
}
