//! `/v1/admin/...`: keys and projects, for admin keys only (403 otherwise).

use axum::extract::State;
use axum::{Extension, Json};
use hearth_store::{KeyInfo, Project};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, HttpError};
use crate::state::AppState;

/// 400 naming `field` unless `value` is a usable name (not blank, not too
/// long: [`hearth_store::ids::check_name`]).
pub(crate) fn check_name(field: &str, value: &str) -> Result<(), HttpError> {
    hearth_store::ids::check_name(field, value)
        .map_err(|message| HttpError(hearth_api::ApiError::bad_request(Some(field), message)))
}

fn key_json(key: &KeyInfo) -> Value {
    json!({
        "id": key.id,
        "object": "api_key",
        "name": key.name,
        "prefix": key.prefix,
        "account_id": key.account_id,
        "default_project_id": key.default_project_id,
        "admin": key.is_admin,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
        "revoked_at": key.revoked_at,
    })
}

fn project_json(project: &Project) -> Value {
    json!({
        "id": project.id,
        "object": "project",
        "name": project.name,
        "created_at": project.created_at,
    })
}

/// `GET /v1/admin/nodes`: the nodes registered in the store (every
/// `hearth serve` sharing it), with whether each is alive (a heartbeat
/// within `--node-timeout-secs`) and which one answered.
pub async fn list_nodes(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let nodes = state.store.nodes().await?;
    let now = hearth_store::ids::now();
    Ok(Json(json!({
        "object": "list",
        "data": nodes.iter().map(|n| json!({
            "id": n.id,
            "object": "node",
            "advertise_url": n.advertise_url,
            "models": n.models,
            "capacity": n.capacity,
            "started_at": n.started_at,
            "heartbeat_at": n.heartbeat_at,
            "alive": n.alive_at(now, state.node.timeout_secs),
            "this_node": *n.id == *state.node.id,
        })).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/admin/keys`: every key, revoked ones included (never the key).
pub async fn list_keys(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let keys = state.store.keys().await?;
    Ok(Json(json!({
        "object": "list",
        "data": keys.iter().map(key_json).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
pub struct CreateKey {
    name: String,
    /// The project the key reaches (default: the default project).
    #[serde(default)]
    project_id: Option<String>,
    #[serde(default)]
    admin: bool,
}

/// `POST /v1/admin/keys` `{name, project_id?, admin?}`: the new key, whose
/// `key` field is the only time it is shown.
pub async fn create_key(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(body): ApiJson<CreateKey>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    check_name("name", &body.name)?;
    let new = state
        .store
        .create_key(&body.name, body.project_id.as_deref(), body.admin)
        .await?;
    let mut value = key_json(&new.info);
    value["key"] = Value::String(new.secret);
    Ok(Json(value))
}

/// `DELETE /v1/admin/keys/{key_id}`: revokes the key at once.
pub async fn revoke_key(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(key_id): ApiPath<String>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let key = state.store.revoke_key(&key_id).await?;
    Ok(Json(key_json(&key)))
}

/// `GET /v1/admin/projects`.
pub async fn list_projects(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let projects = state.store.projects().await?;
    Ok(Json(json!({
        "object": "list",
        "data": projects.iter().map(project_json).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
pub struct CreateProject {
    name: String,
}

/// `POST /v1/admin/projects` `{name}`: a new project, which the calling
/// admin's account may then reach.
pub async fn create_project(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiJson(body): ApiJson<CreateProject>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    check_name("name", &body.name)?;
    let project = state.store.create_project(&body.name).await?;
    if let Some(account) = &ctx.caller.account_id {
        state.store.grant_project(account, &project.id).await?;
    }
    Ok(Json(project_json(&project)))
}
