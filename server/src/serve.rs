//! `hearth serve`: pull what is missing, load the models, listen.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use hearth_engine::catalog::{CatalogEntry, ModelKind};
use hearth_engine::pull::{self, Progress};
use hearth_engine::{BatcherConfig, ChatModel, EmbedModel, EngineConfig};
use rand::RngCore;

use crate::config::ServeArgs;
use crate::state::{now_secs, AppState};

/// Builds the app state: pulls and loads the models named in `args`.
pub fn build_state(args: &ServeArgs, api_keys: Vec<String>) -> anyhow::Result<AppState> {
    let catalog = crate::models_cli::catalog(&args.store)?;
    let entries: Vec<CatalogEntry> = if args.models.is_empty() {
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
    let models_dir = args.store.models_dir();
    let device = candle_core_device();
    let config = EngineConfig {
        max_waiting: args.max_waiting,
        max_active: args.max_active,
        max_batch_tokens: args.max_step_tokens,
        kv_cache_bytes: args.kv_cache_mb.map(|mb| mb << 20),
    };
    let encoder_config = BatcherConfig {
        max_batch_tokens: args.max_batch_tokens,
        max_waiting: args.max_waiting,
    };
    let mut chat = BTreeMap::new();
    let mut embed = BTreeMap::new();
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
                let model = EmbedModel::start(entry, &models_dir, &device, encoder_config.clone())
                    .with_context(|| format!("loading {}", entry.id))?;
                embed.insert(entry.id.clone(), model);
            }
            other => {
                tracing::warn!(model = %entry.id, kind = other.as_str(), "this kind of model is not served yet; skipped")
            }
        }
    }
    Ok(AppState {
        chat: Arc::new(chat),
        embed: Arc::new(embed),
        api_keys: Arc::new(api_keys),
        started_at: now_secs(),
    })
}

fn candle_core_device() -> hearth_engine::Device {
    hearth_engine::Device::Cpu
}

/// A fresh random key: `hearth-` and 32 random bytes in hex.
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("hearth-{}", hex::encode(bytes))
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut keys: Vec<String> = args
        .api_keys
        .iter()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        let key = generate_key();
        println!("No API key configured; generated one for this run (shown once):\n\n    {key}\n");
        keys.push(key);
    }
    let state = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || build_state(&args, keys)).await??
    };
    let listener = tokio::net::TcpListener::bind((args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    println!("Hearth is listening on http://{addr}");
    axum::serve(listener, crate::app::app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
