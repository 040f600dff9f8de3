//! The axum application: `app(state) -> Router`, testable in-process.

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{delete, get, patch, post};
use axum::Router;

use crate::auth::require_key;
use crate::error::method_not_allowed;
use crate::routes;
use crate::state::AppState;

/// Largest request body accepted (prompts of the whole context fit easily).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

pub fn app(state: AppState) -> Router {
    // Routes that name a model: a model served only by another node of
    // the store goes there (`forward.rs`).
    let inference = Router::new()
        .route("/v1/completions", post(routes::completions::create))
        .route("/v1/chat/completions", post(routes::chat::create))
        .route("/v1/responses", post(routes::responses::create))
        .route(
            "/v1/responses/input_tokens",
            post(routes::responses::input_tokens),
        )
        .route("/v1/embeddings", post(routes::embeddings::create))
        .route("/v1/rerank", post(routes::rerank::create))
        .route("/v1/images/generations", post(routes::images::create))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::forward::forward_remote,
        ));
    let api = Router::new()
        .merge(inference)
        .route("/v1/models", get(routes::models::list))
        .route(
            "/v1/models/{*model}",
            get(routes::models::retrieve).delete(routes::models::delete),
        )
        .route(
            "/v1/responses/{response_id}",
            get(routes::responses::retrieve).delete(routes::responses::delete),
        )
        .route(
            "/v1/responses/{response_id}/input_items",
            get(routes::responses::input_items),
        )
        // Uploads stream to storage under their own limit (`--max-upload-mb`).
        .route(
            "/v1/files",
            post(routes::files::upload)
                .layer(DefaultBodyLimit::disable())
                .get(routes::files::list),
        )
        .route(
            "/v1/files/{file_id}",
            get(routes::files::retrieve).delete(routes::files::delete),
        )
        .route("/v1/files/{file_id}/content", get(routes::files::content))
        .route("/v1/files/{file_id}/link", get(routes::files::link))
        .route(
            "/v1/fine_tuning/jobs",
            post(routes::fine_tuning::create).get(routes::fine_tuning::list),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}",
            get(routes::fine_tuning::retrieve),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}/cancel",
            post(routes::fine_tuning::cancel),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}/events",
            get(routes::fine_tuning::events),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}/checkpoints",
            get(routes::fine_tuning::checkpoints),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}",
            get(routes::fine_tuning::checkpoint),
        )
        .route(
            "/v1/fine_tuning/models/spec-draft",
            get(routes::fine_tuning::spec_draft),
        )
        // The spec serves this one without the version prefix too.
        .route(
            "/fine_tuning/models/spec-draft",
            get(routes::fine_tuning::spec_draft),
        )
        .route(
            "/v1/batches",
            post(routes::batches::create).get(routes::batches::list),
        )
        .route("/v1/batches/{batch_id}", get(routes::batches::retrieve))
        .route(
            "/v0/dedicated_endpoints/templates",
            get(routes::endpoints::templates),
        )
        .route(
            "/v0/dedicated_endpoints",
            post(routes::endpoints::create).get(routes::endpoints::list),
        )
        .route(
            "/v0/dedicated_endpoints/{endpoint_id}",
            patch(routes::endpoints::update).delete(routes::endpoints::delete),
        )
        .route(
            "/v1/batches/{batch_id}/cancel",
            post(routes::batches::cancel),
        )
        .route(
            "/v1/datasets",
            post(routes::datasets::create).get(routes::datasets::list),
        )
        .route(
            "/v1/datasets/{dataset_id}",
            get(routes::datasets::retrieve)
                .patch(routes::datasets::patch)
                .delete(routes::datasets::delete),
        )
        .route(
            "/v1/datasets/{dataset_id}/content",
            get(routes::datasets::content),
        )
        .route(
            "/v1/datasets/{dataset_id}/export",
            get(routes::datasets::export),
        )
        .route(
            "/v1/datasets/{dataset_id}/query_templates",
            get(routes::datasets::query_templates),
        )
        .route(
            "/v1/datasets/uploads",
            post(routes::dataset_uploads::create),
        )
        .route(
            "/v1/datasets/uploads/{upload_id}",
            get(routes::dataset_uploads::retrieve),
        )
        .route(
            "/v1/datasets/uploads/{upload_id}/parts",
            post(routes::dataset_uploads::add_part).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/datasets/uploads/{upload_id}/complete",
            post(routes::dataset_uploads::complete),
        )
        .route(
            "/v1/datasets/uploads/{upload_id}/cancel",
            post(routes::dataset_uploads::cancel),
        )
        .merge(admin_routes())
        .route("/v1/usage", get(routes::usage::usage));
    let api = if state.http.metrics_public {
        api
    } else {
        api.route("/metrics", get(routes::metrics::metrics))
    };
    let api = api
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let public = Router::new()
        .route("/health", get(routes::health::ready))
        .route("/health/ready", get(routes::health::ready))
        .route("/health/live", get(routes::health::live))
        // Signed links carry their own authority: no key.
        .route("/v1/files/{file_id}/download", get(routes::files::download))
        .route("/openapi.json", get(crate::openapi::openapi_json))
        .route("/docs", get(crate::openapi::docs));
    let public = if state.http.metrics_public {
        public.route("/metrics", get(routes::metrics::metrics))
    } else {
        public
    };
    let router = public
        .merge(crate::console::router())
        .merge(crate::iam::router(&state))
        .merge(api)
        .fallback(crate::console::not_found)
        .method_not_allowed_fallback(crate::console::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::layers::request_timeout,
        ));
    crate::layers::wrap(router, &state.http).with_state(state)
}

/// `/v1/admin/...`: admin keys only. The check is a layer, so a key that
/// is not an admin key gets its 403 before any handler reads (and
/// validates) the body.
fn admin_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/admin/keys",
            get(routes::admin::list_keys).post(routes::admin::create_key),
        )
        .route("/v1/admin/keys/{key_id}", delete(routes::admin::revoke_key))
        .route("/v1/admin/nodes", get(routes::admin::list_nodes))
        .route(
            "/v1/admin/projects",
            get(routes::admin::list_projects).post(routes::admin::create_project),
        )
        .route(
            "/v1/admin/adapters",
            get(routes::adapters::list).post(routes::adapters::import),
        )
        .route(
            "/v1/admin/adapters/{adapter_id}",
            delete(routes::adapters::delete),
        )
        .route(
            "/v1/admin/projects/{project_id}/budget",
            get(routes::usage::get_budget).put(routes::usage::set_budget),
        )
        .route(
            "/v1/admin/projects/{project_id}/quotas",
            get(routes::usage::list_quotas).put(routes::usage::set_quota),
        )
        .route_layer(middleware::from_fn(crate::auth::require_admin_key))
}
