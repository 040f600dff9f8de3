//! Operations of `/v0/dedicated_endpoints`.

#![allow(dead_code)]

use hearth_api::endpoints::{
    CreateEndpointRequest, EndpointList, EndpointObject, TemplateList, UpdateEndpointRequest,
};
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::ProjectQuery;

#[utoipa::path(
    get,
    path = "/v0/dedicated_endpoints/templates",
    tag = "Dedicated endpoints",
    operation_id = "listEndpointTemplates",
    summary = "Models the project can deploy, with this node's flavors",
    description = "One template per served chat model and per adapter (fine-tuned model) over \
        one, with the flavors whose reservation fits what this node sets aside for endpoints \
        (`--endpoint-memory-mb`, `--endpoint-threads`). A flavor's `resources` are what each \
        replica reserves.",
    params(ProjectQuery),
    responses((status = 200, description = "The templates.", body = TemplateList))
)]
pub fn list_templates() {}

#[utoipa::path(
    post,
    path = "/v0/dedicated_endpoints",
    tag = "Dedicated endpoints",
    operation_id = "createEndpoint",
    summary = "Deploy a model on replicas of its own",
    description = "Answers at once with the endpoint `provisioning` (or `stopped` when \
        `enabled` is false); its replicas load in the background and it becomes `running` \
        (or `failed` with `status_reason`). Send its `routing_key` as `model` to \
        `/v1/chat/completions`, `/v1/completions` or `/v1/responses`.",
    params(ProjectQuery),
    request_body = CreateEndpointRequest,
    responses(
        (status = 201, description = "The endpoint.", body = EndpointObject),
        (status = 400, description = "A model the project cannot deploy, a flavor the \
            template does not have, a `gpu_type`, `gpu_count` or `region` other than the \
            flavor's, scaling out of range, or replicas that do not fit beside the other \
            endpoints (the message says what is missing).", body = UpstreamError),
    )
)]
pub fn create_endpoint() {}

#[utoipa::path(
    get,
    path = "/v0/dedicated_endpoints",
    tag = "Dedicated endpoints",
    operation_id = "listEndpoints",
    summary = "The project's endpoints, oldest first",
    params(ProjectQuery),
    responses((status = 200, description = "The endpoints.", body = EndpointList))
)]
pub fn list_endpoints() {}

#[utoipa::path(
    patch,
    path = "/v0/dedicated_endpoints/{endpoint_id}",
    tag = "Dedicated endpoints",
    operation_id = "updateEndpoint",
    summary = "Rename, resize, rescale, stop or start an endpoint",
    description = "Only the fields given change. A new flavor or replica count comes back \
        `updating`: replicas are reloaded one at a time, so the endpoint keeps serving; \
        `enabled: false` comes back `stopping`.",
    params(("endpoint_id" = String, Path, description = "The endpoint's id (a UUID).", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"), ProjectQuery),
    request_body = UpdateEndpointRequest,
    responses(
        (status = 200, description = "The endpoint.", body = EndpointObject),
        (status = 400, description = "A field that cannot change, a flavor the template does \
            not have, scaling out of range, or replicas that do not fit.", body = UpstreamError),
        (status = 403, description = "No such endpoint among the caller's projects.",
            body = ErrorDetail),
    )
)]
pub fn update_endpoint() {}

#[utoipa::path(
    delete,
    path = "/v0/dedicated_endpoints/{endpoint_id}",
    tag = "Dedicated endpoints",
    operation_id = "deleteEndpoint",
    summary = "Delete an endpoint",
    description = "Its routing key stops reaching it at once; requests in flight finish, then \
        its replicas' memory is freed.",
    params(("endpoint_id" = String, Path, description = "The endpoint's id (a UUID).", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"), ProjectQuery),
    responses(
        (status = 200, description = "An empty object.", body = Object),
        (status = 403, description = "No such endpoint among the caller's projects.",
            body = ErrorDetail),
    )
)]
pub fn delete_endpoint() {}
