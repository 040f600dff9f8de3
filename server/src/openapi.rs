//! `GET /openapi.json`: the API as an OpenAPI 3.1 document, generated from
//! the wire types of hearth-api (`utoipa::ToSchema`) and the operation
//! declarations in `openapi/` (one file per endpoint family; stubs that
//! only carry `#[utoipa::path]`, the handlers live in `routes/`).
//! `finish.rs` then adds the errors every operation shares and gives the
//! generic schemas their names.
//!
//! `info.version` is `<API_DATE>-<build>`: the date of the API's last
//! change and the short git commit the server was built from (the crate
//! version outside a checkout; see `build.rs`). Change [`API_DATE`] with
//! every change of the API.
//!
//! `GET /docs` is a small page listing the operations, generated from the
//! same document (no external scripts or styles).

mod admin;
mod batches;
mod datasets;
mod docs_page;
mod endpoints;
mod files;
mod fine_tuning;
mod finish;
mod inference;
mod responses;
mod usage;

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use hearth_api::schemas::{ErrorDetail, Health, StreamErrorEvent, UpstreamError, ValidationError};
use hearth_api::{ChatCompletionChunk, CompletionChoice, UsageInfo};
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

/// Date of the API's last change: the first part of `info.version`.
pub const API_DATE: &str = "2026-11-26";

/// `info.version`: `<API_DATE>-<build>`.
pub fn version() -> String {
    format!("{API_DATE}-{}", env!("HEARTH_BUILD_ID"))
}

/// A `text/event-stream` body (see its description).
pub struct EventStream;

impl PartialSchema for EventStream {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Server-sent events: `data: <chunk JSON>` and a blank line per chunk \
                 (`CompletionChunk` or `ChatCompletionChunk`); with \
                 `stream_options.include_usage` a last chunk with `usage` and no choices; \
                 then `data: [DONE]`. A failure after the stream started is sent as a \
                 `StreamErrorEvent`, then `data: [DONE]`.",
            ))
            .into()
    }
}

impl ToSchema for EventStream {}

/// Bytes of any kind (file contents).
pub struct Binary;

impl PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .content_media_type("application/octet-stream")
            .into()
    }
}

impl ToSchema for Binary {}

#[allow(dead_code)]
mod service {
    use hearth_api::schemas::Health;

    #[utoipa::path(
        get,
        path = "/health",
        tag = "Service",
        operation_id = "health",
        summary = "Readiness (as /health/ready); no key",
        security(()),
        responses(
            (status = 200, description = "Ready.", body = Health),
            (status = 503, description = "An engine stopped, or the server is shutting down.",
                body = Health),
        )
    )]
    pub fn health() {}

    #[utoipa::path(
        get,
        path = "/health/ready",
        tag = "Service",
        operation_id = "healthReady",
        summary = "Readiness: serving and not shutting down; no key",
        security(()),
        responses(
            (status = 200, description = "Ready.", body = Health),
            (status = 503, description = "An engine stopped, or the server is shutting down.",
                body = Health),
        )
    )]
    pub fn ready() {}

    #[utoipa::path(
        get,
        path = "/health/live",
        tag = "Service",
        operation_id = "healthLive",
        summary = "Liveness: every engine loop runs; no key",
        security(()),
        responses(
            (status = 200, description = "Alive.", body = Health),
            (status = 503, description = "An engine stopped: restart the server.", body = Health),
        )
    )]
    pub fn live() {}

    #[utoipa::path(
        get,
        path = "/metrics",
        tag = "Service",
        operation_id = "metrics",
        summary = "Engine counters in the Prometheus text format",
        description = "Needs a key unless the server runs with `--metrics-public`.",
        security(("bearer" = []), ()),
        responses(
            (status = 200, description = "Prometheus text exposition.",
                content((String = "text/plain; version=0.0.4"))),
        )
    )]
    pub fn metrics() {}

    #[utoipa::path(
        get,
        path = "/openapi.json",
        tag = "Service",
        operation_id = "openapi",
        summary = "This document; no key",
        security(()),
        responses(
            (status = 200, description = "The OpenAPI 3.1 document.",
                content((Object = "application/json"))),
        )
    )]
    pub fn openapi() {}

    #[utoipa::path(
        get,
        path = "/docs",
        tag = "Service",
        operation_id = "docs",
        summary = "The operations of this document as a page; no key",
        security(()),
        responses(
            (status = 200, description = "An HTML page.", content((String = "text/html; charset=utf-8"))),
        )
    )]
    pub fn docs() {}
}

/// The bearer scheme (every operation needs it unless it says otherwise).
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(
            "An API key (`hearth keys create`, or the admin key `serve` prints on an \
             empty store, or an `--api-key`)."
                .to_string(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(http));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth",
        description = "A self-hosted, OpenAI-compatible inference server: completions, chat, \
            embeddings, rerank, files, datasets, LoRA fine-tuning, batches and dedicated endpoints. Every operation is scoped to a \
            project (`ai_project_id`, else the key's default project). Errors come in three \
            shapes: `ErrorDetail` (A), `UpstreamError` (B) and `ValidationError` (C, 422).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        inference::list_models,
        inference::retrieve_model,
        inference::delete_model,
        inference::create_completion,
        inference::create_chat_completion,
        inference::create_embedding,
        inference::create_rerank,
        inference::create_image,
        responses::create_response,
        responses::count_input_tokens,
        responses::retrieve_response,
        responses::delete_response,
        responses::list_input_items,
        files::upload_file,
        files::list_files,
        files::retrieve_file,
        files::delete_file,
        files::file_content,
        files::file_link,
        files::download_file,
        fine_tuning::create_job,
        fine_tuning::list_jobs,
        fine_tuning::retrieve_job,
        fine_tuning::cancel_job,
        fine_tuning::list_events,
        fine_tuning::list_checkpoints,
        fine_tuning::retrieve_checkpoint,
        fine_tuning::spec_draft,
        fine_tuning::spec_draft_unversioned,
        batches::create_batch,
        batches::list_batches,
        batches::retrieve_batch,
        batches::cancel_batch,
        endpoints::list_templates,
        endpoints::create_endpoint,
        endpoints::list_endpoints,
        endpoints::update_endpoint,
        endpoints::delete_endpoint,
        datasets::create_dataset,
        datasets::list_datasets,
        datasets::retrieve_dataset,
        datasets::update_dataset,
        datasets::delete_dataset,
        datasets::dataset_content,
        datasets::export_dataset,
        datasets::query_templates,
        datasets::create_upload,
        datasets::retrieve_upload,
        datasets::add_part,
        datasets::complete_upload,
        datasets::cancel_upload,
        admin::list_keys,
        admin::list_nodes,
        admin::create_key,
        admin::revoke_key,
        admin::list_projects,
        admin::create_project,
        admin::import_adapter,
        admin::list_adapters,
        admin::delete_adapter,
        usage::get_budget,
        usage::set_budget,
        usage::list_quotas,
        usage::set_quota,
        usage::get_usage,
        service::health,
        service::ready,
        service::live,
        service::metrics,
        service::openapi,
        service::docs,
    ),
    components(schemas(
        ErrorDetail,
        UpstreamError,
        ValidationError,
        StreamErrorEvent,
        Health,
        ChatCompletionChunk,
        hearth_api::Completion<CompletionChoice, Option<UsageInfo>>,
    )),
    modifiers(&Bearer),
    security(("bearer" = [])),
    tags(
        (name = "Models"), (name = "Completions"), (name = "Chat"), (name = "Responses"),
        (name = "Embeddings"),
        (name = "Rerank"), (name = "Images"), (name = "Files"), (name = "Fine-tuning"), (name = "Batches"),
        (name = "Datasets"), (name = "Dedicated endpoints"),
        (name = "Usage", description = "What each project used and spent."),
        (name = "Admin"),
        (name = "Service", description = "Health, metrics and this document."),
    )
)]
struct ApiDoc;

/// The finished document (built once).
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
        finish::finish(doc, &version())
    })
}

/// `GET /openapi.json`.
pub async fn openapi_json() -> Response {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    let body = BODY.get_or_init(|| serde_json::to_vec(document()).unwrap_or_default());
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.as_slice(),
    )
        .into_response()
}

/// `GET /docs`.
pub async fn docs() -> Html<&'static str> {
    static PAGE: OnceLock<String> = OnceLock::new();
    Html(PAGE.get_or_init(|| docs_page::render(document())).as_str())
}
