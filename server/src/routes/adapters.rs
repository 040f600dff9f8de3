//! `/v1/admin/adapters`: LoRA adapters imported from outside, for admin
//! keys only (403 otherwise). An import names a project, a served base
//! model, a name and the two PEFT files uploaded through `/v1/files`; the
//! files are checked against the base (target modules, rank, every A and B
//! shape) before anything is stored, and every refusal is 400 shape B
//! naming the field. The adapter is then served to that project as
//! `<base>:<name>:<id>` (see `crate::imported_adapters`).

use axum::extract::State;
use axum::{Extension, Json};
use futures_util::TryStreamExt;
use hearth_api::admin::{AdapterList, AdapterObject, DeletedAdapter, ImportAdapterRequest};
use hearth_api::ApiError;
use hearth_engine::PeftFiles;
use hearth_store::adapters::name_problem;
use hearth_store::{NewAdapter, StoreError};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, HttpError};
use crate::imported_adapters::{adapter_object, details, stored_files};
use crate::state::AppState;

fn bad(param: &str, message: impl Into<String>) -> HttpError {
    HttpError(ApiError::bad_request(Some(param), message))
}

/// The whole content of the project's file `file_id`; a missing file (or
/// one of another project) is 400 naming `param`.
async fn file_bytes(
    state: &AppState,
    project: &str,
    file_id: &str,
    param: &str,
) -> Result<Vec<u8>, HttpError> {
    let file = match state.store.file(project, file_id).await {
        Ok(f) => f,
        Err(StoreError::NotFound(_)) => {
            return Err(bad(
                param,
                format!("The file `{file_id}` does not exist in the project `{project}`."),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let chunks: Vec<bytes::Bytes> = state.store.file_content(&file).await?.try_collect().await?;
    Ok(chunks.concat())
}

/// `POST /v1/admin/adapters`: checks and registers an adapter.
pub async fn import(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(body): ApiJson<ImportAdapterRequest>,
) -> Result<Json<AdapterObject>, HttpError> {
    ctx.require_admin()?;
    let project = body.project_id.clone().unwrap_or(ctx.project_id.clone());
    if state.store.project(&project).await?.is_none() {
        return Err(bad(
            "project_id",
            format!("The project `{project}` does not exist."),
        ));
    }
    if let Some(problem) = name_problem(&body.name) {
        return Err(bad("name", format!("{problem}.")));
    }
    if state
        .store
        .adapter_by_name(&project, &body.name)
        .await?
        .is_some()
    {
        return Err(bad(
            "name",
            format!(
                "The project already has an adapter named `{}`; delete it first or choose another name.",
                body.name
            ),
        ));
    }
    let Some(base) = state.chat.get(&body.base_model) else {
        return Err(bad(
            "base_model",
            format!(
                "`{}` is not a chat model this server serves.",
                body.base_model
            ),
        ));
    };
    let weights = file_bytes(&state, &project, &body.weights_file, "weights_file").await?;
    let config = file_bytes(&state, &project, &body.config_file, "config_file").await?;
    let config = String::from_utf8(config)
        .map_err(|_| bad("config_file", "The adapter config is not UTF-8 text."))?;
    if let Err(e) = serde_json::from_str::<serde_json::Value>(&config) {
        return Err(bad(
            "config_file",
            format!("The adapter config is not JSON (adapter_config.json): {e}."),
        ));
    }
    let files = PeftFiles { weights, config };
    let engine = base.engine.clone();
    let (files, checked) = tokio::task::spawn_blocking(move || {
        let checked = engine.adapters().prepare(&files);
        (files, checked)
    })
    .await
    .map_err(|_| HttpError(ApiError::internal()))?;
    let adapter = checked.map_err(|e| {
        bad(
            "weights_file",
            format!("The adapter cannot run on `{}`: {e:#}.", body.base_model),
        )
    })?;
    let created = state
        .store
        .create_adapter(NewAdapter {
            project_id: &project,
            name: &body.name,
            base_model: &body.base_model,
            details: details(&adapter),
            files: &stored_files(&files),
        })
        .await
        .map_err(|e| match e {
            StoreError::Invalid(message) => bad("name", message),
            e => e.into(),
        })?;
    tracing::info!(adapter = %created.id, model = %created.model, "adapter imported");
    Ok(Json(adapter_object(&created)))
}

/// `GET /v1/admin/adapters`: every project's imported adapters.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
) -> Result<Json<AdapterList>, HttpError> {
    ctx.require_admin()?;
    let data = state
        .store
        .list_adapters(None)
        .await?
        .iter()
        .map(adapter_object)
        .collect();
    Ok(Json(AdapterList {
        object: "list".to_string(),
        data,
    }))
}

/// `DELETE /v1/admin/adapters/{adapter_id}`: the adapter is no longer
/// served (a request already running with it finishes).
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(adapter_id): ApiPath<String>,
) -> Result<Json<DeletedAdapter>, HttpError> {
    ctx.require_admin()?;
    let gone = state.store.delete_adapter(&adapter_id).await?;
    Ok(Json(DeletedAdapter {
        id: gone.id,
        object: "adapter".to_string(),
        deleted: true,
    }))
}
