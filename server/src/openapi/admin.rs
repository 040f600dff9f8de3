//! Operations of `/v1/admin` (admin keys only; other keys get 403): keys,
//! projects and imported LoRA adapters.

#![allow(dead_code)]

use hearth_api::admin::{
    AdapterList, AdapterObject, ApiKeyList, ApiKeyObject, CreateKeyRequest, CreateProjectRequest,
    CreatedApiKey, DeletedAdapter, ImportAdapterRequest, ProjectList, ProjectObject,
};
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::ProjectQuery;

#[utoipa::path(
    get,
    path = "/v1/admin/nodes",
    tag = "Admin",
    operation_id = "listNodes",
    summary = "The nodes serving this store",
    description = "Every `hearth serve` sharing the store registers itself: `{object: list, \
        data: [{id, object: node, advertise_url, models, capacity, started_at, heartbeat_at, \
        alive, this_node}]}`; `alive` is a heartbeat within `--node-timeout-secs`.",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The nodes, by id."),
        (status = 403, description = "Not an admin key.", body = ErrorDetail),
    )
)]
pub fn list_nodes() {}

#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    tag = "Admin",
    operation_id = "listApiKeys",
    summary = "Every API key, revoked ones included",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The keys (never the keys themselves).", body = ApiKeyList),
    )
)]
pub fn list_keys() {}

#[utoipa::path(
    post,
    path = "/v1/admin/keys",
    tag = "Admin",
    operation_id = "createApiKey",
    summary = "Create an API key",
    params(ProjectQuery),
    request_body = CreateKeyRequest,
    responses(
        (status = 200, description = "The new key; `key` is shown this once.", body = CreatedApiKey),
        (status = 400, description = "The request cannot be applied (e.g. a bad `name`).",
            body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
    )
)]
pub fn create_key() {}

#[utoipa::path(
    delete,
    path = "/v1/admin/keys/{key_id}",
    tag = "Admin",
    operation_id = "revokeApiKey",
    summary = "Revoke an API key at once",
    params(
        ("key_id" = String, Path, description = "The key's id.", pattern = r"^key-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The key, with `revoked_at` set.", body = ApiKeyObject),
    )
)]
pub fn revoke_key() {}

#[utoipa::path(
    get,
    path = "/v1/admin/projects",
    tag = "Admin",
    operation_id = "listProjects",
    summary = "Every project",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The projects.", body = ProjectList),
    )
)]
pub fn list_projects() {}

#[utoipa::path(
    post,
    path = "/v1/admin/projects",
    tag = "Admin",
    operation_id = "createProject",
    summary = "Create a project, reachable by the calling admin's account",
    params(ProjectQuery),
    request_body = CreateProjectRequest,
    responses(
        (status = 200, description = "The new project.", body = ProjectObject),
        (status = 400, description = "The request cannot be applied (e.g. a bad `name`).",
            body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
    )
)]
pub fn create_project() {}

#[utoipa::path(
    post,
    path = "/v1/admin/adapters",
    tag = "Admin",
    operation_id = "importAdapter",
    summary = "Import a PEFT LoRA adapter for a project",
    description = "Upload `adapter_model.safetensors` and `adapter_config.json` with \
        `POST /v1/files` (any purpose) to the project first. The adapter is checked against \
        the served base model (plain LoRA; target modules, rank and every A/B shape) and then \
        served to that project only, by chat, completions and responses, as `model` \
        (`<base_model>:<name>:<id>`), and listed in its `/v1/models`.",
    params(ProjectQuery),
    request_body = ImportAdapterRequest,
    responses(
        (status = 200, description = "The imported adapter.", body = AdapterObject),
        (status = 400, description = "An unknown project, a bad or taken `name`, a base model \
            this server does not serve, a file missing from the project, or an adapter that \
            does not fit the base (`param` names the field).", body = UpstreamError),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
    )
)]
pub fn import_adapter() {}

#[utoipa::path(
    get,
    path = "/v1/admin/adapters",
    tag = "Admin",
    operation_id = "listAdapters",
    summary = "Every project's imported adapters",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The adapters, oldest first.", body = AdapterList),
    )
)]
pub fn list_adapters() {}

#[utoipa::path(
    delete,
    path = "/v1/admin/adapters/{adapter_id}",
    tag = "Admin",
    operation_id = "deleteAdapter",
    summary = "Delete an imported adapter (no longer served)",
    params(
        ("adapter_id" = String, Path, description = "The adapter's id.", pattern = r"^adapter-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The adapter is gone.", body = DeletedAdapter),
    )
)]
pub fn delete_adapter() {}
