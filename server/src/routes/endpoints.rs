//! `/v0/dedicated_endpoints`: templates, create, list, update, delete.
//!
//! Routes write the desired state into the store and wake the reconciler
//! (`crate::endpoints::reconcile`), which loads or drops replicas; they
//! answer at once (`provisioning`, `updating`, `stopping`, `deleting`).
//! Creation and updates are admitted only when every endpoint's reserved
//! memory and threads still fit what the node sets aside for them. Lists,
//! templates and creation work in the caller's project; `PATCH` and
//! `DELETE` find the endpoint in any project the caller may use (another
//! account's: 403 like a missing one).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use hearth_api::endpoints::{
    CreateEndpointRequest, EndpointList, EndpointObject, Flavor, PatchError, TemplateList,
    UpdateEndpointRequest, REGION_LOCAL,
};
use hearth_api::{ApiError, Loc, ProjectQuery, ValidationItem};
use hearth_store::{DedicatedEndpoint, EndpointPatch, NewEndpoint, StoreError};
use serde_json::{json, Map, Value};

use crate::auth::RequestContext;
use crate::endpoints::host::{self, Need};
use crate::endpoints::reconcile::reserved_by_others;
use crate::endpoints::templates::{deployable, deployables, Deployable};
use crate::endpoints::{endpoint_object, HostConfig};
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

const KIND: &str = "dedicated endpoint";

/// `GET /v0/dedicated_endpoints/templates`: one per model the caller's
/// project may deploy that has a flavor fitting this node.
pub async fn templates(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
) -> Result<Json<TemplateList>, HttpError> {
    let Some(host) = state.endpoints.host() else {
        return Ok(Json(TemplateList::new(Vec::new())));
    };
    let templates = deployables(&state, &ctx.project_id)
        .await?
        .iter()
        .map(|d| d.template(host))
        .filter(|t| !t.flavors.is_empty())
        .collect();
    Ok(Json(TemplateList::new(templates)))
}

/// `POST /v0/dedicated_endpoints`: 201 with the endpoint, `provisioning`
/// (or `stopped` when created with `enabled: false`).
pub async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(request): ApiJson<CreateEndpointRequest>,
) -> Result<(StatusCode, Json<EndpointObject>), HttpError> {
    request.check()?;
    let host = host_of(&state)?;
    let model = deployable(&state, &ctx.project_id, &request.model_name)
        .await?
        .ok_or_else(|| {
            bad(
                "model_name",
                format!(
                    "`{}` is not a model this project can deploy (see GET \
                     /v0/dedicated_endpoints/templates).",
                    request.model_name
                ),
            )
        })?;
    let flavor = pick_flavor(host, &model, &request.flavor_name)?;
    if let Some(gpu_type) = request.gpu_type.as_deref() {
        if Some(gpu_type) != flavor.gpu_type.as_deref() {
            return Err(bad(
                "gpu_type",
                format!(
                    "The flavor `{}` runs on `{}`, not `{gpu_type}`.",
                    flavor.flavor_name,
                    flavor.gpu_type.as_deref().unwrap_or("null")
                ),
            ));
        }
    }
    if let Some(count) = request.gpu_count {
        if count != flavor.gpu_count {
            return Err(bad(
                "gpu_count",
                format!(
                    "The flavor `{}` has `gpu_count` {}, not {count}.",
                    flavor.flavor_name, flavor.gpu_count
                ),
            ));
        }
    }
    let scaling = request.scaling.unwrap_or_default();
    let enabled = request.enabled.unwrap_or(true);
    let _admission = state.endpoints.admission().await;
    if enabled {
        admit(&state, host, "", &flavor, scaling.max_replicas).await?;
    }
    let id = uuid::Uuid::new_v4().to_string();
    let new = NewEndpoint {
        routing_key: format!("{}:{}", model.name, &id[..8]),
        id,
        project_id: ctx.project_id.clone(),
        name: request.name,
        description: request.description,
        model_name: model.name.clone(),
        flavor_name: flavor.flavor_name.clone(),
        gpu_type: flavor.gpu_type.clone(),
        gpu_count: flavor.gpu_count as i64,
        region: REGION_LOCAL.to_string(),
        min_replicas: scaling.min_replicas as i64,
        max_replicas: scaling.max_replicas as i64,
        enabled,
    };
    let row = match state.store.create_endpoint(new.clone()).await {
        // A routing key's 32 random bits met another's: take the whole id.
        Err(StoreError::InUse(_)) => {
            let routing_key = format!("{}:{}", model.name, new.id);
            state
                .store
                .create_endpoint(NewEndpoint { routing_key, ..new })
                .await?
        }
        other => other?,
    };
    tracing::info!(endpoint = %row.id, model = %row.model_name, flavor = %row.flavor_name,
        routing_key = %row.routing_key, "dedicated endpoint created");
    state.endpoints.register(&row);
    state.endpoints.wake();
    Ok((
        StatusCode::CREATED,
        Json(endpoint_object(row, &state.endpoints)),
    ))
}

/// `GET /v0/dedicated_endpoints`: the project's endpoints, oldest first.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
) -> Result<Json<EndpointList>, HttpError> {
    let rows = state.store.list_endpoints(&ctx.project_id).await?;
    Ok(Json(EndpointList::new(
        rows.into_iter()
            .map(|r| endpoint_object(r, &state.endpoints))
            .collect(),
    )))
}

/// `PATCH /v0/dedicated_endpoints/{endpoint_id}`: `name`, `description`,
/// `flavor_name`, `scaling`, `enabled`. A change of what runs comes back
/// `updating` (replicas reloaded one at a time) or `stopping`.
pub async fn update(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(endpoint_id): ApiPath<String>,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<EndpointObject>, HttpError> {
    let row = caller_endpoint(&state, &ctx, &endpoint_id).await?;
    let patch = UpdateEndpointRequest::parse(&body).map_err(|e| match e {
        PatchError::Refused(e) => HttpError(e),
        PatchError::Malformed(msg) => HttpError(ApiError::validation(vec![ValidationItem {
            kind: "model_attributes_type".into(),
            loc: vec![Loc::from("body")],
            msg,
            input: Value::Object(body.clone()),
            ctx: None,
        }])),
    })?;
    let enabled = patch.enabled.unwrap_or(row.enabled);
    let flavor_name = patch.flavor_name.as_deref().unwrap_or(&row.flavor_name);
    let replicas = patch
        .scaling
        .map_or(row.max_replicas.max(1) as u32, |s| s.max_replicas);
    let _admission = state.endpoints.admission().await;
    if enabled {
        let host = host_of(&state)?;
        let model = deployable(&state, &row.project_id, &row.model_name)
            .await?
            .ok_or_else(|| {
                HttpError(ApiError::unavailable(format!(
                    "The model `{}` is no longer served by this node.",
                    row.model_name
                )))
            })?;
        let flavor = pick_flavor(host, &model, flavor_name)?;
        admit(&state, host, &row.id, &flavor, replicas).await?;
    }
    let updated = state
        .store
        .update_endpoint(
            &row.id,
            &EndpointPatch {
                name: patch.name,
                description: patch.description,
                flavor_name: patch.flavor_name,
                min_replicas: patch.scaling.map(|s| s.min_replicas as i64),
                max_replicas: patch.scaling.map(|s| s.max_replicas as i64),
                enabled: patch.enabled,
            },
        )
        .await?;
    if updated.generation != row.generation {
        tracing::info!(endpoint = %row.id, status = %updated.status, "dedicated endpoint updated");
        state.endpoints.wake();
    }
    Ok(Json(endpoint_object(updated, &state.endpoints)))
}

/// `DELETE /v0/dedicated_endpoints/{endpoint_id}`: 200 `{}`. The endpoint
/// stops taking requests at once; those in flight finish, then its
/// replicas' memory is freed.
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(endpoint_id): ApiPath<String>,
) -> Result<Json<Value>, HttpError> {
    let row = caller_endpoint(&state, &ctx, &endpoint_id).await?;
    state.store.mark_endpoint_deleting(&row.id).await?;
    state.endpoints.remove(&row.id);
    state.endpoints.wake();
    tracing::info!(endpoint = %row.id, "dedicated endpoint deleting");
    Ok(Json(json!({})))
}

/// The endpoint `id` (a UUID: 422 shape C otherwise) in any project the
/// caller may use; else 403, as for a missing one.
async fn caller_endpoint(
    state: &AppState,
    ctx: &RequestContext,
    id: &str,
) -> Result<DedicatedEndpoint, HttpError> {
    let Ok(uuid) = uuid::Uuid::parse_str(id) else {
        return Err(HttpError(ApiError::validation(vec![ValidationItem {
            kind: "uuid_parsing".into(),
            loc: vec![Loc::from("path"), Loc::Key("endpoint_id".into())],
            msg: "Input should be a valid UUID".into(),
            input: Value::String(id.to_string()),
            ctx: None,
        }])));
    };
    let row = match state.store.endpoint_by_id(&uuid.to_string()).await {
        Ok(row) if row.status != "deleting" => row,
        Ok(_) => return Err(StoreError::NotFound(KIND).into()),
        Err(e) => return Err(e.into()),
    };
    ctx.check_owner(&state.store, &row.project_id, KIND).await?;
    Ok(row)
}

fn host_of(state: &AppState) -> Result<&HostConfig, HttpError> {
    state.endpoints.host().ok_or_else(|| {
        HttpError(ApiError::unavailable(
            "This server runs no models, so it cannot host dedicated endpoints.",
        ))
    })
}

fn bad(param: &str, message: String) -> HttpError {
    HttpError(ApiError::bad_request(Some(param), message))
}

fn pick_flavor(host: &HostConfig, model: &Deployable, name: &str) -> Result<Flavor, HttpError> {
    model.flavor(host, name).ok_or_else(|| {
        let names: Vec<String> = model
            .flavors(host)
            .into_iter()
            .map(|f| format!("`{}`", f.flavor_name))
            .collect();
        bad(
            "flavor_name",
            format!(
                "`{name}` is not a flavor of `{}` on this node; its flavors: {}.",
                model.name,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        )
    })
}

/// 400 shape B naming what is missing when `replicas` (an endpoint's
/// `max_replicas`: it may scale up to them) of `flavor` do not fit beside
/// the other endpoints' reservations.
async fn admit(
    state: &AppState,
    host: &HostConfig,
    except: &str,
    flavor: &Flavor,
    replicas: u32,
) -> Result<(), HttpError> {
    let others: Need = reserved_by_others(state, host, except).await;
    let wanted = host::need(flavor).times(replicas.max(1) as u64);
    match host::shortfall(&host.capacity, others, wanted) {
        None => Ok(()),
        Some(missing) => Err(bad(
            "flavor_name",
            format!(
                "{replicas} replica(s) of `{}` do not fit on this node: {missing}.",
                flavor.flavor_name
            ),
        )),
    }
}
