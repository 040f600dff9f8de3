//! Which model a request's `model` name means, for chat and completions.
//!
//! A name is, in order: a served chat model (the base, no adapter); the
//! routing key of one of the project's dedicated endpoints (its
//! least-loaded replica, `crate::endpoints`); a LoRA
//! adapter of the catalogue (`kind = "adapter"`, [`AppState::adapters`]);
//! or whatever the pluggable [`AdapterSource`] in [`AppState::adapter_source`]
//! knows for the caller's project (e.g. fine-tuned models
//! `BASE:suffix:ftjob-...` whose PEFT files live in the blob store). An
//! adapter runs on its base's engine; the engine's adapter cache loads it
//! once (through the model's loader) and keeps the most recently used ones.
//! Anything else is 404 (400 for an embedding model), as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hearth_api::ApiError;
use hearth_engine::{AdapterLoader, ChatModel, LoadedAdapter};

use crate::error::HttpError;
use crate::routes::generate::chat_model;
use crate::state::AppState;

/// A model served as an adapter over a base chat model.
#[derive(Clone)]
pub struct AdapterModel {
    /// The name clients use (`model`), also the adapter cache key.
    pub id: String,
    /// Id of the served base chat model.
    pub base: String,
    pub owned_by: String,
    /// `created` in /v1/models (seconds since the epoch).
    pub created: u64,
    pub description: Option<String>,
    /// Fetches the PEFT files (only on a cache miss).
    pub loader: AdapterLoader,
}

/// Boxed future of the [`AdapterSource`] methods.
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Adapter models beyond the catalogue, per project: the hook for
/// fine-tuned models. Set it in [`AppState::adapter_source`].
pub trait AdapterSource: Send + Sync {
    /// The adapter model `name` of `project`, `Ok(None)` when this source
    /// does not know the name (then the request is 404).
    fn resolve<'a>(
        &'a self,
        project: &'a str,
        name: &'a str,
    ) -> SourceFuture<'a, Result<Option<AdapterModel>, ApiError>>;

    /// The adapter models `project` may use, for /v1/models.
    fn list<'a>(
        &'a self,
        project: &'a str,
    ) -> SourceFuture<'a, Result<Vec<AdapterModel>, ApiError>>;
}

/// The chat model a request names and, for an adapter model, the adapter
/// loaded on the base's engine (pass it to `EngineHandle::submit_with`).
pub async fn resolve_chat(
    state: &AppState,
    project: &str,
    name: &str,
) -> Result<(ChatModel, Option<LoadedAdapter>), HttpError> {
    if let Some(model) = state.chat.get(name) {
        return Ok((model.clone(), None));
    }
    if let Some(routed) = state.endpoints.route(project, name) {
        return routed.map_err(HttpError);
    }
    let Some(adapter) = find_adapter(state, project, name).await? else {
        return chat_model(state, name).map(|m| (m, None));
    };
    let Some(base) = state.chat.get(&adapter.base) else {
        return Err(HttpError(ApiError::unavailable(format!(
            "`{name}` adapts `{}`, which this server does not serve",
            adapter.base
        ))));
    };
    let loaded = base
        .engine
        .adapters()
        .get(&adapter.id, &adapter.loader)
        .await
        .map_err(|e| {
            tracing::error!(model = %name, "cannot load adapter: {e:#}");
            // The cause (paths, shapes, store errors) stays in the log.
            HttpError(ApiError::model_failed(format!(
                "The adapter `{name}` could not be loaded; see the server log."
            )))
        })?;
    Ok((base.clone(), Some(loaded)))
}

/// The adapter model `name` for `project`: a catalogue adapter, else what
/// the adapter source knows; `None` when neither does.
pub async fn find_adapter(
    state: &AppState,
    project: &str,
    name: &str,
) -> Result<Option<AdapterModel>, HttpError> {
    if let Some(a) = state.adapters.get(name) {
        return Ok(Some(a.clone()));
    }
    match &state.adapter_source {
        Some(source) => Ok(source.resolve(project, name).await?),
        None => Ok(None),
    }
}

/// Adapter models of the catalogue and of the source for `project`.
pub async fn list_adapters(
    state: &AppState,
    project: &str,
) -> Result<Vec<AdapterModel>, HttpError> {
    let mut out: Vec<AdapterModel> = state.adapters.values().cloned().collect();
    if let Some(source) = &state.adapter_source {
        out.extend(source.list(project).await?);
    }
    Ok(out)
}

/// A catalogue adapter entry as an [`AdapterModel`] over its local folder.
pub fn catalogue_adapter(
    entry: &hearth_engine::catalog::CatalogEntry,
    dir: std::path::PathBuf,
    created: u64,
) -> AdapterModel {
    AdapterModel {
        id: entry.id.clone(),
        base: entry.base.clone().unwrap_or_default(),
        owned_by: entry.owner(),
        created,
        description: entry.description.clone(),
        loader: hearth_engine::adapters::dir_loader(dir),
    }
}

/// Shared handle type of the hook.
pub type SharedAdapterSource = Arc<dyn AdapterSource>;
