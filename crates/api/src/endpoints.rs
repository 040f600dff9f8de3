//! `/v0/dedicated_endpoints` wire types: templates, creation and update
//! bodies (checked), the endpoint object and its list.
//!
//! A dedicated endpoint is a named deployment of one model with resources
//! of its own (a flavor: threads, KV cache, concurrent sequences), reached
//! by sending its `routing_key` as `model`. The bodies follow Nebius AI
//! Studio's: `name`, `description`, `model_name`, `flavor_name`,
//! `gpu_type`, `gpu_count`, `region`, `scaling: {min_replicas,
//! max_replicas}`, and `enabled`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::common::{check_len, OBJECT_LIST};
use crate::error::ApiError;

/// `object` of an endpoint.
pub const OBJECT_ENDPOINT: &str = "dedicated_endpoint";
/// The only region of a self-hosted node.
pub const REGION_LOCAL: &str = "local";
/// `gpu_type` of the flavors that run on the CPU.
pub const GPU_TYPE_CPU: &str = "cpu";
/// Most replicas one endpoint may ask for.
pub const MAX_REPLICAS: u32 = 8;
/// Longest name, in bytes.
pub const MAX_NAME: usize = 128;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024;

/// What one replica of a flavor reserves on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FlavorResources {
    /// Threads of the replica's own pool.
    pub threads: u32,
    /// Bytes of its KV cache, in MiB (0 for an embedding model).
    pub kv_cache_mb: u64,
    /// Sequences it advances together (for an embedding model: requests
    /// it queues).
    pub max_active: u32,
    /// Memory the replica reserves in all (weights, KV cache, working
    /// memory), in MiB: what admission control counts.
    pub memory_mb: u64,
}

/// One way to deploy a template's model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Flavor {
    pub flavor_name: String,
    /// `cpu` on a host without accelerators, else the device kind.
    pub gpu_type: Option<String>,
    pub gpu_count: u32,
    pub regions: Vec<String>,
    pub resources: FlavorResources,
}

/// A model that can back an endpoint, with its flavors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EndpointTemplate {
    pub model_name: String,
    pub description: Option<String>,
    pub context_length: u64,
    pub flavors: Vec<Flavor>,
}

/// `GET /v0/dedicated_endpoints/templates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    pub object: String,
    pub templates: Vec<EndpointTemplate>,
}

impl TemplateList {
    pub fn new(templates: Vec<EndpointTemplate>) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            templates,
        }
    }
}

/// Replicas an endpoint keeps running (`min_replicas`, at least one) and
/// may grow to (`max_replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Scaling {
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Default for Scaling {
    fn default() -> Self {
        Self {
            min_replicas: 1,
            max_replicas: 1,
        }
    }
}

impl Scaling {
    /// `1 <= min_replicas <= max_replicas <= MAX_REPLICAS` (400 naming the
    /// field otherwise).
    pub fn check(&self) -> Result<(), ApiError> {
        let bad = |field: &str, message: String| {
            Err(ApiError::bad_request(
                Some(&format!("scaling.{field}")),
                message,
            ))
        };
        if self.min_replicas < 1 {
            return bad(
                "min_replicas",
                "`min_replicas` must be at least 1 (an endpoint keeps that many replicas loaded)."
                    .into(),
            );
        }
        if self.max_replicas < self.min_replicas {
            return bad(
                "max_replicas",
                "`max_replicas` must be at least `min_replicas`.".into(),
            );
        }
        if self.max_replicas > MAX_REPLICAS {
            return bad(
                "max_replicas",
                format!("`max_replicas` must be at most {MAX_REPLICAS}."),
            );
        }
        Ok(())
    }
}

/// Body of `POST /v0/dedicated_endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateEndpointRequest {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A template's `model_name`.
    pub model_name: String,
    /// One of that template's flavors.
    pub flavor_name: String,
    /// When given, the flavor's `gpu_type`.
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// When given, the flavor's `gpu_count`.
    #[serde(default)]
    pub gpu_count: Option<u32>,
    /// When given, `local`.
    #[serde(default)]
    pub region: Option<String>,
    /// Default: one replica.
    #[serde(default)]
    pub scaling: Option<Scaling>,
    /// `false` creates it stopped. Default `true`.
    #[serde(default)]
    pub enabled: Option<bool>,
}

impl CreateEndpointRequest {
    /// Checks what needs no template: name, description, region, scaling.
    pub fn check(&self) -> Result<(), ApiError> {
        check_name(&self.name)?;
        if let Some(d) = &self.description {
            check_len("description", d, MAX_DESCRIPTION)?;
        }
        if let Some(region) = self.region.as_deref() {
            if region != REGION_LOCAL {
                return Err(ApiError::bad_request(
                    Some("region"),
                    format!(
                        "Unknown region `{region}`; this server has one region, `{REGION_LOCAL}`."
                    ),
                ));
            }
        }
        if self.model_name.trim().is_empty() {
            return Err(ApiError::bad_request(
                Some("model_name"),
                "`model_name` must not be empty.",
            ));
        }
        self.scaling.unwrap_or_default().check()
    }
}

/// Body of `PATCH /v0/dedicated_endpoints/{id}`: only the fields given
/// change; `null` clears `description`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
pub struct UpdateEndpointRequest {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "crate::de::double_option")]
    pub description: Option<Option<String>>,
    pub flavor_name: Option<String>,
    pub scaling: Option<Scaling>,
    pub enabled: Option<bool>,
}

/// The fields `PATCH` may change.
pub const PATCHABLE: &[&str] = &["name", "description", "flavor_name", "scaling", "enabled"];

/// Fields of the creation body that stay as created (400 when patched).
const FIXED: &[&str] = &["model_name", "region", "gpu_type", "gpu_count"];

impl UpdateEndpointRequest {
    /// Parses a patch body: a field that cannot change is 400 naming it,
    /// a value of the wrong type 422 (as a malformed body).
    pub fn parse(body: &Map<String, Value>) -> Result<Self, PatchError> {
        if let Some(field) = body.keys().find(|k| !PATCHABLE.contains(&k.as_str())) {
            let why = if FIXED.contains(&field.as_str()) {
                "is fixed when the endpoint is created"
            } else {
                "is not a field of an endpoint"
            };
            return Err(PatchError::Refused(ApiError::bad_request(
                Some(field),
                format!(
                    "`{field}` {why}; a patch may set `name`, `description`, `flavor_name`, \
                     `scaling` and `enabled`."
                ),
            )));
        }
        let patch: Self = serde_json::from_value(Value::Object(body.clone()))
            .map_err(|e| PatchError::Malformed(e.to_string()))?;
        if let Some(name) = &patch.name {
            check_name(name).map_err(PatchError::Refused)?;
        }
        if let Some(Some(d)) = &patch.description {
            check_len("description", d, MAX_DESCRIPTION).map_err(PatchError::Refused)?;
        }
        if let Some(s) = &patch.scaling {
            s.check().map_err(PatchError::Refused)?;
        }
        Ok(patch)
    }
}

/// Why a patch body was not taken.
#[derive(Debug)]
pub enum PatchError {
    /// A well-formed body asking for what cannot be (400).
    Refused(ApiError),
    /// A value of the wrong type (422 shape C, with serde's message).
    Malformed(String),
}

/// An endpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EndpointObject {
    /// A UUID.
    pub endpoint_id: String,
    pub object: String,
    pub name: String,
    pub description: Option<String>,
    pub model_name: String,
    /// The `model` value that reaches this endpoint.
    pub routing_key: String,
    pub flavor_name: String,
    pub gpu_type: Option<String>,
    pub gpu_count: u32,
    pub region: String,
    pub scaling: Scaling,
    pub enabled: bool,
    /// `provisioning`, `running`, `updating`, `failed`, `stopping`,
    /// `stopped` or `deleting`.
    pub status: String,
    /// Why it failed (or what it waits for), when it did.
    pub status_reason: Option<String>,
    /// Replicas serving now on this node.
    pub ready_replicas: u32,
    pub created_at: i64,
    pub updated_at: i64,
    pub ai_project_id: String,
}

/// `GET /v0/dedicated_endpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EndpointList {
    pub object: String,
    pub data: Vec<EndpointObject>,
}

impl EndpointList {
    pub fn new(data: Vec<EndpointObject>) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            data,
        }
    }
}

/// An endpoint's name: non-blank, at most [`MAX_NAME`] bytes.
fn check_name(name: &str) -> Result<(), ApiError> {
    crate::common::check_name(name, MAX_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(body: Value) -> CreateEndpointRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn creation_checks_name_region_and_scaling() {
        let ok = create(json!({"name": "a", "model_name": "m", "flavor_name": "f"}));
        assert!(ok.check().is_ok());
        let cases = [
            (
                json!({"name": " ", "model_name": "m", "flavor_name": "f"}),
                "name",
            ),
            (
                json!({"name": "a", "model_name": "m", "flavor_name": "f", "region": "eu-north1"}),
                "region",
            ),
            (
                json!({"name": "a", "model_name": "m", "flavor_name": "f",
                       "scaling": {"min_replicas": 0, "max_replicas": 1}}),
                "scaling.min_replicas",
            ),
            (
                json!({"name": "a", "model_name": "m", "flavor_name": "f",
                       "scaling": {"min_replicas": 2, "max_replicas": 1}}),
                "scaling.max_replicas",
            ),
            (
                json!({"name": "a", "model_name": "m", "flavor_name": "f",
                       "scaling": {"min_replicas": 1, "max_replicas": 9}}),
                "scaling.max_replicas",
            ),
            (
                json!({"name": "a".repeat(129), "model_name": "m", "flavor_name": "f"}),
                "name",
            ),
        ];
        for (body, param) in cases {
            let err = create(body).check().unwrap_err();
            assert_eq!(err.status(), 400);
            assert_eq!(err.param(), Some(param));
        }
    }

    #[test]
    fn a_patch_takes_only_what_may_change() {
        let body = |v: Value| v.as_object().unwrap().clone();
        let p =
            UpdateEndpointRequest::parse(&body(json!({"description": null, "name": "b"}))).unwrap();
        assert_eq!(p.description, Some(None));
        assert_eq!(p.name.as_deref(), Some("b"));
        for field in ["model_name", "region", "routing_key"] {
            match UpdateEndpointRequest::parse(&body(json!({field: "x"}))) {
                Err(PatchError::Refused(e)) => assert_eq!(e.param(), Some(field)),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            UpdateEndpointRequest::parse(&body(json!({"enabled": "yes"}))),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            UpdateEndpointRequest::parse(&body(
                json!({"scaling": {"min_replicas": 3, "max_replicas": 2}})
            )),
            Err(PatchError::Refused(_))
        ));
    }
}
