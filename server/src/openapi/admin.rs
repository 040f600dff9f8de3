//! Operations of `/v1/admin` (admin keys only; other keys get 403).

#![allow(dead_code)]

use hearth_api::admin::{
    ApiKeyList, ApiKeyObject, CreateKeyRequest, CreateProjectRequest, CreatedApiKey, ProjectList,
    ProjectObject,
};
use hearth_api::schemas::ErrorDetail;
use hearth_api::ProjectQuery;

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
