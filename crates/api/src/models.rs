//! Wire types of `GET /v1/models`: the query (`verbose`, `ai_project_id`) and
//! the model list. The verbose-only fields are skipped when `None`.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::common::{OBJECT_LIST, OBJECT_MODEL};
use crate::de::deserialize_lenient_bool;

/// Query of `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModelsQuery {
    /// Adds kind, context length, pricing and description to each model.
    /// pydantic's booleans (`true`, `1`, `yes`, `on`, ...); default false.
    #[serde(default, deserialize_with = "deserialize_lenient_bool")]
    #[param(value_type = Option<bool>)]
    pub verbose: bool,
    /// The project whose models are listed (see [`crate::ProjectQuery`]).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

/// Body of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelObject>,
}

impl ModelList {
    pub fn new(data: Vec<ModelObject>) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            data,
        }
    }
}

/// One model of the catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelObject {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// Verbose only: `chat`, `embed`, `rerank`, `image` or `adapter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Verbose only: the context length in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    /// Verbose only: price per million tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<ModelPricing>,
    /// Verbose only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// For an adapter (LoRA) model: the model it adapts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// For an adapter (LoRA) model: the base model at the root of its lineage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

impl ModelObject {
    /// The plain (non-verbose) object.
    pub fn new(id: impl Into<String>, created: u64, owned_by: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            object: OBJECT_MODEL.to_string(),
            created,
            owned_by: owned_by.into(),
            kind: None,
            context_length: None,
            pricing: None,
            description: None,
            parent: None,
            root: None,
        }
    }
}

/// `pricing` of a verbose model object: price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelPricing {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

/// Body of `DELETE /v1/models/{model}` (a fine-tuned model deleted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelDeleted {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub deleted: bool,
}

impl ModelDeleted {
    /// `model` deleted.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            object: OBJECT_MODEL.to_string(),
            deleted: true,
        }
    }
}
