//! Which models can back an endpoint (the templates), and the flavors each
//! may run with on this host.
//!
//! A deployable model is a chat or embedding model this server loaded, or
//! a LoRA adapter over a chat model (a catalogue adapter, or a fine-tuned
//! model of the caller's project). A replica loads its own copy of the
//! base's weights, with an adapter folded into them at load.

use hearth_api::endpoints::{EndpointTemplate, Flavor};
use hearth_engine::catalog::CatalogEntry;
use hearth_engine::catalog::WeightFormat;
use hearth_engine::{ChatModel, EmbedModel};

use super::host::{self, ModelFootprint};
use super::HostConfig;
use crate::error::HttpError;
use crate::models_resolve::{find_adapter, list_adapters, AdapterModel};
use crate::state::AppState;

/// A model an endpoint may serve.
#[derive(Clone)]
pub struct Deployable {
    /// The `model_name` of templates and endpoints.
    pub name: String,
    /// The shared instance of the base model (its catalogue entry is
    /// loaded again for each replica).
    pub base: Base,
    /// The adapter of a fine-tuned (or catalogue adapter) model.
    pub adapter: Option<AdapterModel>,
    pub description: Option<String>,
}

/// The served model a deployment copies.
#[derive(Clone)]
pub enum Base {
    Chat(ChatModel),
    Embed(EmbedModel),
}

impl Base {
    pub fn entry(&self) -> &CatalogEntry {
        match self {
            Base::Chat(m) => &m.entry,
            Base::Embed(m) => &m.entry,
        }
    }
}

impl Deployable {
    fn footprint(&self, host: &HostConfig) -> ModelFootprint {
        let entry = self.base.entry();
        let weights = match entry.format {
            WeightFormat::Gguf => {
                std::fs::metadata(entry.weights_path(&host.models_dir)).map_or(0, |m| m.len())
            }
            WeightFormat::Safetensors => {
                hearth_engine::load::dir_bytes(&entry.dir(&host.models_dir)) as u64
            }
        };
        match &self.base {
            Base::Chat(m) => ModelFootprint {
                weights: if self.adapter.is_some() {
                    2 * weights
                } else {
                    weights
                },
                min_kv: m.engine.min_kv_bytes() as u64,
                encoder: false,
            },
            // f32 weights, and their bf16 copy where the CPU computes in it.
            Base::Embed(_) => ModelFootprint {
                weights: 2 * weights,
                min_kv: 0,
                encoder: true,
            },
        }
    }

    /// Its flavors on this host.
    pub fn flavors(&self, host: &HostConfig) -> Vec<Flavor> {
        host::flavors(&host.capacity, &self.footprint(host))
    }

    /// Its flavor named `name`.
    pub fn flavor(&self, host: &HostConfig, name: &str) -> Option<Flavor> {
        self.flavors(host)
            .into_iter()
            .find(|f| f.flavor_name == name)
    }

    pub fn template(&self, host: &HostConfig) -> EndpointTemplate {
        EndpointTemplate {
            model_name: self.name.clone(),
            description: self.description.clone(),
            context_length: match &self.base {
                Base::Chat(m) => m.engine.context_length() as u64,
                Base::Embed(m) => m.max_tokens as u64,
            },
            flavors: self.flavors(host),
        }
    }
}

fn base_model(base: Base) -> Deployable {
    Deployable {
        name: base.entry().id.clone(),
        description: base.entry().description.clone(),
        base,
        adapter: None,
    }
}

fn adapter_model(state: &AppState, adapter: AdapterModel) -> Option<Deployable> {
    let base = state.chat.get(&adapter.base)?;
    Some(Deployable {
        name: adapter.id.clone(),
        base: Base::Chat(base.clone()),
        description: adapter.description.clone(),
        adapter: Some(adapter),
    })
}

/// Every model `project` may deploy: the served chat models, the adapters
/// over them, then the embedding and rerank models.
pub async fn deployables(state: &AppState, project: &str) -> Result<Vec<Deployable>, HttpError> {
    let mut out: Vec<Deployable> = state
        .chat
        .values()
        .map(|m| base_model(Base::Chat(m.clone())))
        .collect();
    for adapter in list_adapters(state, project).await? {
        out.extend(adapter_model(state, adapter));
    }
    out.extend(
        state
            .embed
            .values()
            .map(|m| base_model(Base::Embed(m.clone()))),
    );
    Ok(out)
}

/// The deployable model `name` of `project`, if there is one.
pub async fn deployable(
    state: &AppState,
    project: &str,
    name: &str,
) -> Result<Option<Deployable>, HttpError> {
    if let Some(base) = state.chat.get(name) {
        return Ok(Some(base_model(Base::Chat(base.clone()))));
    }
    if let Some(base) = state.embed.get(name) {
        return Ok(Some(base_model(Base::Embed(base.clone()))));
    }
    let adapter = find_adapter(state, project, name).await?;
    Ok(adapter.and_then(|a| adapter_model(state, a)))
}
