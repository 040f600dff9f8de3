//! LoRA adapters imported from outside (PEFT folders or uploaded files),
//! registered per project by `hearth models import-adapter` or
//! `POST /v1/admin/adapters` after their shapes were checked against the
//! base, and served like fine-tuned models under `<base>:<name>:adapter-...`
//! (through [`crate::fine_tuned::FineTunedModels`], the server's
//! `AdapterSource`): only to their project, from the files kept in the blob
//! store, loaded once into the base engine's adapter cache under that
//! unique name.

use hearth_api::admin::AdapterObject;
use hearth_api::ApiError;
use hearth_engine::{LoraAdapter, PeftFiles};
use hearth_jobs::worker::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use hearth_store::adapters::{adapter_blob_prefix, is_well_formed_adapter_id};
use hearth_store::{ImportedAdapter, ResultFile, Store, StoreError};
use serde_json::{json, Value};

use crate::fine_tuned::blob_loader;
use crate::models_resolve::AdapterModel;

/// What the row records about a checked adapter (shown by the admin API).
pub fn details(adapter: &LoraAdapter) -> Value {
    let c = &adapter.config;
    json!({
        "r": c.r,
        "lora_alpha": c.alpha,
        "use_rslora": c.use_rslora,
        "target_modules": c.targets.iter().map(|t| t.peft_name()).collect::<Vec<_>>(),
        "base_model_name_or_path": c.base_model,
    })
}

/// PEFT's two files, as the store keeps them (under their PEFT names).
pub fn stored_files(files: &PeftFiles) -> [ResultFile<'_>; 2] {
    [
        ResultFile {
            filename: ADAPTER_WEIGHTS,
            bytes: &files.weights,
        },
        ResultFile {
            filename: ADAPTER_CONFIG,
            bytes: files.config.as_bytes(),
        },
    ]
}

/// The adapter as the admin API shows it.
pub fn adapter_object(a: &ImportedAdapter) -> AdapterObject {
    AdapterObject {
        id: a.id.clone(),
        object: "adapter".to_string(),
        project_id: a.project_id.clone(),
        name: a.name.clone(),
        base_model: a.base_model.clone(),
        model: a.model.clone(),
        r: a.details["r"].as_u64(),
        lora_alpha: a.details["lora_alpha"].as_f64(),
        target_modules: a.details["target_modules"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        created_at: a.created_at,
    }
}

/// The adapter as a servable model.
fn adapter_model(store: &Store, a: &ImportedAdapter) -> AdapterModel {
    AdapterModel {
        id: a.model.clone(),
        base: a.base_model.clone(),
        owned_by: a.project_id.clone(),
        created: a.created_at.max(0) as u64,
        description: Some(format!(
            "LoRA adapter `{}` over {} (imported)",
            a.name, a.base_model
        )),
        loader: blob_loader(store.clone(), adapter_blob_prefix(&a.id)),
    }
}

fn internal(e: StoreError) -> ApiError {
    tracing::error!("imported adapter lookup failed: {e}");
    ApiError::internal()
}

/// The project's imported adapter served as `name`, if `name` is one.
pub async fn resolve(
    store: &Store,
    project: &str,
    name: &str,
) -> Result<Option<AdapterModel>, ApiError> {
    let Some((_, id)) = name.rsplit_once(':') else {
        return Ok(None);
    };
    if !is_well_formed_adapter_id(id) {
        return Ok(None);
    }
    match store.adapter(project, id).await {
        Ok(a) if a.model == name => Ok(Some(adapter_model(store, &a))),
        Ok(_) | Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(internal(e)),
    }
}

/// The project's imported adapters as models, for /v1/models.
pub async fn list(store: &Store, project: &str) -> Result<Vec<AdapterModel>, ApiError> {
    Ok(store
        .list_adapters(Some(project))
        .await
        .map_err(internal)?
        .iter()
        .map(|a| adapter_model(store, a))
        .collect())
}
