//! `/v1/admin` wire types: API keys and projects, their lists and the
//! creation bodies (admin keys only).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An API key as the admin routes show it (never the key itself, except
/// in [`CreatedApiKey`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyObject {
    pub id: String,
    /// `api_key`.
    pub object: String,
    pub name: String,
    /// The key's first characters, e.g. `hearth-1a2b3c4d`.
    pub prefix: String,
    pub account_id: String,
    pub default_project_id: String,
    pub admin: bool,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// `POST /v1/admin/keys`: the new key, with `key` shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub info: ApiKeyObject,
    /// The key to send as `Authorization: Bearer <key>`.
    pub key: String,
}

/// `GET /v1/admin/keys`: every key, revoked ones included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    /// `list`.
    pub object: String,
    pub data: Vec<ApiKeyObject>,
}

/// Body of `POST /v1/admin/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateKeyRequest {
    pub name: String,
    /// The project the key reaches (default: the default project).
    #[serde(default)]
    pub project_id: Option<String>,
    /// Whether the key reaches the admin routes (default false).
    #[serde(default)]
    pub admin: bool,
}

/// A project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProjectObject {
    /// `project-` and a ULID.
    pub id: String,
    /// `project`.
    pub object: String,
    pub name: String,
    pub created_at: i64,
}

/// `GET /v1/admin/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProjectList {
    /// `list`.
    pub object: String,
    pub data: Vec<ProjectObject>,
}

/// Body of `POST /v1/admin/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateProjectRequest {
    pub name: String,
}
