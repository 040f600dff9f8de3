//! `/v1/admin` wire types: API keys, projects and imported LoRA adapters,
//! their lists and the creation bodies (admin keys only).

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

/// Body of `POST /v1/admin/adapters`: registers a PEFT LoRA adapter
/// uploaded as two files (`POST /v1/files`, any purpose) for a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImportAdapterRequest {
    /// The project that may use the adapter (default: the request's
    /// project).
    #[serde(default)]
    pub project_id: Option<String>,
    /// The served chat model the adapter was trained on (its catalogue id).
    pub base_model: String,
    /// 1 to 64 letters, digits, `-`, `_` or `.`; unique in the project.
    pub name: String,
    /// A file of the project holding `adapter_model.safetensors`.
    pub weights_file: String,
    /// A file of the project holding `adapter_config.json`.
    pub config_file: String,
}

/// An imported LoRA adapter, served to its project as `model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AdapterObject {
    /// `adapter-` and a ULID.
    pub id: String,
    /// `adapter`.
    pub object: String,
    pub project_id: String,
    pub name: String,
    pub base_model: String,
    /// The model name requests use: `<base_model>:<name>:<id>`.
    pub model: String,
    /// The LoRA rank.
    pub r: Option<u64>,
    pub lora_alpha: Option<f64>,
    /// The adapted projections (`q_proj`, `v_proj`, ...).
    pub target_modules: Vec<String>,
    pub created_at: i64,
}

/// `GET /v1/admin/adapters`: every project's imported adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AdapterList {
    /// `list`.
    pub object: String,
    pub data: Vec<AdapterObject>,
}

/// `DELETE /v1/admin/adapters/{adapter_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeletedAdapter {
    pub id: String,
    /// `adapter`.
    pub object: String,
    pub deleted: bool,
}
