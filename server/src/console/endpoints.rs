//! Dedicated endpoints: the project's endpoints with their status and
//! replicas (the endpoints API's list), create (a name, a deployable model
//! and a flavor from the API's templates, through its create handler, which
//! checks them and the node's capacity), scale (minimum and maximum
//! replicas through its update handler, with the same checks as a PATCH)
//! and delete (its handler).

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use hearth_api::endpoints::CreateEndpointRequest;
use hearth_api::ProjectQuery;
use maud::html;

use super::form::{self, Form};
use super::layout::{self, csrf_field, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::routes::endpoints as api;
use crate::state::AppState;

/// `GET /console/endpoints`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let notice = match form::query(&uri).get("notice") {
        Some("deleted") => Some("The endpoint is being deleted: its replicas stop."),
        Some("created") => Some("The endpoint was created: its replicas are starting."),
        Some("scaled") => Some("The endpoint's scaling was changed."),
        _ => None,
    };
    page(&state, &session, StatusCode::OK, notice, None).await
}

/// `POST /console/endpoints` `{csrf, name, model_name, flavor_name,
/// description?}`.
pub async fn create(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let request = CreateEndpointRequest {
        name: form.get("name").unwrap_or_default().to_string(),
        description: form.get("description").map(str::to_string),
        model_name: form.get("model_name").unwrap_or_default().to_string(),
        flavor_name: form.get("flavor_name").unwrap_or_default().to_string(),
        gpu_type: None,
        gpu_count: None,
        region: None,
        scaling: None,
        enabled: None,
    };
    let created = api::create(
        State(state.clone()),
        Extension(session.ctx()),
        ApiQuery(ProjectQuery::default()),
        ApiJson(request),
    )
    .await;
    after(created, "created", &state, &session).await
}

/// Back to the list with `notice` when the API's handler succeeded, else
/// the list again with the API's error.
async fn after<T>(
    result: Result<T, HttpError>,
    notice: &str,
    state: &AppState,
    session: &Session,
) -> Response {
    let to = format!("/console/endpoints?notice={notice}");
    layout::redirect_or(result, &to, |status, message| async move {
        page(state, session, status, None, Some(&message)).await
    })
    .await
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    notice: Option<&str>,
    error: Option<&str>,
) -> Response {
    let ctx = || Extension(session.ctx());
    let q = || ApiQuery(ProjectQuery::default());
    let listed = api::list(State(state.clone()), ctx(), q()).await;
    let templates = api::templates(State(state.clone()), ctx(), q()).await;
    let (endpoints, templates) = match (listed, templates) {
        (Ok(l), Ok(t)) => (l.0.data, t.0.templates),
        (Err(e), _) | (_, Err(e)) => return layout::error_page(e),
    };
    let body = html! {
        h1 { "Dedicated endpoints" }
        (layout::notice(notice))
        @if let Some(e) = error { p.error role="alert" { (e) } }
        p { "Replicas of a model reserved for this project, reached by their routing key as the model name." }
        @if templates.is_empty() { p { "This node can deploy no model for this project now." } } @else {
            form method="post" action="/console/endpoints" {
                (csrf_field(session))
                h2 { "Create an endpoint" }
                label for="ep-name" { "Name" }
                input #ep-name type="text" name="name" required maxlength="100";
                label for="ep-model" { "Model" }
                select #ep-model name="model_name" {
                    @for t in &templates { option value=(t.model_name) { (t.model_name) } }
                }
                label for="ep-flavor" { "Flavor" }
                select #ep-flavor name="flavor_name" {
                    @for f in flavors(&templates) { option value=(f.0) { (f.0) " (" (f.1) ")" } }
                }
                label for="ep-description" { "Description (optional)" }
                input #ep-description type="text" name="description" maxlength="500";
                button type="submit" { "Create endpoint" }
            }
        }
        @if endpoints.is_empty() { p { "No endpoints in this project." } } @else {
            div.scroll { table {
                caption.visually-hidden { "Dedicated endpoints" }
                thead { tr { th scope="col" { "Name" } th scope="col" { "Routing key" } th scope="col" { "Model" }
                    th scope="col" { "Flavor" } th scope="col" { "Status" } th scope="col" { "Replicas" }
                    th scope="col" { span.visually-hidden { "Actions" } } } }
                tbody { @for e in &endpoints { tr {
                    td.name { (e.name) }
                    td { code { (e.routing_key) } }
                    td { (e.model_name) }
                    td { (e.flavor_name) }
                    td { span class={ "status " (e.status) } { (e.status) }
                        @if let Some(r) = &e.status_reason { br; small { (r) } } }
                    td { (e.ready_replicas) " ready of " (e.scaling.min_replicas) "–" (e.scaling.max_replicas)
                        @if !e.enabled { " (disabled)" } }
                    td { @if e.status != "deleting" {
                        form.inline method="post" action={ "/console/endpoints/" (e.endpoint_id) "/scale" } {
                            (csrf_field(session))
                            label for={ "min-" (e.endpoint_id) } { "Min" }
                            input id={ "min-" (e.endpoint_id) } type="number" name="min_replicas" min="1"
                                value=(e.scaling.min_replicas) class="replicas";
                            label for={ "max-" (e.endpoint_id) } { "Max" }
                            input id={ "max-" (e.endpoint_id) } type="number" name="max_replicas" min="1"
                                value=(e.scaling.max_replicas) class="replicas";
                            button type="submit" { "Scale" span.visually-hidden { " " (e.name) } }
                        }
                        form.inline method="post" action={ "/console/endpoints/" (e.endpoint_id) "/delete" }
                            data-confirm={ "Delete the endpoint " (e.name) "?" } {
                            (csrf_field(session))
                            button.danger type="submit" { "Delete" span.visually-hidden { " " (e.name) } }
                        }
                    } }
                } } }
            } }
        }
    };
    render(
        state,
        session,
        Section::Endpoints,
        status,
        "Dedicated endpoints",
        body,
    )
    .await
}

/// `POST /console/endpoints/{endpoint_id}/scale` `{csrf, min_replicas,
/// max_replicas}`: the API's update with `{"scaling": {...}}`; a value
/// that is not a whole number goes on as text, for the API to refuse.
pub async fn scale(
    State(state): State<AppState>,
    session: Session,
    ApiPath(endpoint_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    // Plain words for what is not a count; the API checks the rest (the
    // order of the two, the node's capacity).
    let field = |name: &str| {
        form.get(name)
            .unwrap_or_default()
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 1)
    };
    let (Some(min), Some(max)) = (field("min_replicas"), field("max_replicas")) else {
        let message = "Min and max replicas are whole numbers, at least 1.";
        return page(
            &state,
            &session,
            StatusCode::BAD_REQUEST,
            None,
            Some(message),
        )
        .await;
    };
    let mut body = serde_json::Map::new();
    body.insert(
        "scaling".into(),
        serde_json::json!({"min_replicas": min, "max_replicas": max}),
    );
    let updated = api::update(
        State(state.clone()),
        Extension(session.ctx()),
        ApiPath(endpoint_id),
        ApiJson(body),
    )
    .await;
    after(updated, "scaled", &state, &session).await
}

/// `POST /console/endpoints/{endpoint_id}/delete` `{csrf}`.
pub async fn delete(
    State(state): State<AppState>,
    session: Session,
    ApiPath(endpoint_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let deleted = api::delete(
        State(state.clone()),
        Extension(session.ctx()),
        ApiPath(endpoint_id),
    )
    .await;
    after(deleted, "deleted", &state, &session).await
}

/// Every flavor name of the templates once, with its resources in words.
fn flavors(templates: &[hearth_api::endpoints::EndpointTemplate]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for f in templates.iter().flat_map(|t| &t.flavors) {
        if !out.iter().any(|(name, _)| *name == f.flavor_name) {
            let r = &f.resources;
            let words = format!("{} threads, {} MB KV cache", r.threads, r.kv_cache_mb);
            out.push((f.flavor_name.clone(), words));
        }
    }
    out
}
