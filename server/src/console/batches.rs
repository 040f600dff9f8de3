//! Batches: the project's batches with their progress and result files,
//! a batch started from an uploaded file (the batches API's own create
//! handler: the same checks of every line), and cancel.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use hearth_api::batches::{BatchListQuery, BATCH_ENDPOINTS, COMPLETION_WINDOWS, PURPOSE_BATCH};
use hearth_api::{FilesQuery, ProjectQuery};
use maud::html;
use serde_json::json;

use super::form::{self, Form};
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::routes::{batches as api, files as files_api};
use crate::state::AppState;

/// A failed batch's problems shown on its row (the API lists them all).
const ERRORS_SHOWN: usize = 5;

/// `GET /console/batches`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let notice = match form::query(&uri).get("notice") {
        Some("created") => Some("Batch created: it runs in the background."),
        Some("cancelled") => Some("Cancel requested."),
        _ => None,
    };
    page(
        &state,
        &session,
        StatusCode::OK,
        notice,
        Refusal::None,
        &Form::default(),
    )
    .await
}

/// What was refused, and so where its message goes.
enum Refusal<'a> {
    None,
    /// The start form's input: shown in the form (at the top when the
    /// form is not drawn, having no file to offer).
    Start(&'a str),
    /// A batch's cancel: shown at the top.
    Cancel(&'a str),
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    notice: Option<&str>,
    refusal: Refusal<'_>,
    entered: &Form,
) -> Response {
    let ctx = || Extension(session.ctx());
    let query = BatchListQuery {
        limit: Some(100),
        ..Default::default()
    };
    let batches = api::list(State(state.clone()), ctx(), ApiQuery(query)).await;
    let files_query = FilesQuery {
        limit: Some(200),
        purpose: Some(PURPOSE_BATCH.into()),
        ..Default::default()
    };
    let files = files_api::list(State(state.clone()), ctx(), ApiQuery(files_query)).await;
    let (batches, files) = match (batches, files) {
        (Ok(b), Ok(f)) => (b.0.data, f.0.data),
        (Err(e), _) | (_, Err(e)) => return layout::error_page(e),
    };
    let picked = |name: &str, value: &str| entered.get(name) == Some(value);
    let (form_error_text, top_error) = match refusal {
        Refusal::None => (None, None),
        Refusal::Start(e) if !files.is_empty() => (Some(e), None),
        Refusal::Start(e) | Refusal::Cancel(e) => (None, Some(e)),
    };
    let body = html! {
        h1 { "Batches" }
        (layout::notice(notice))
        (form_error("page-error", top_error))
        section aria-labelledby="new-batch" {
            h2 #new-batch { "Start a batch" }
            @if files.is_empty() {
                p { "Upload a JSONL file of requests (purpose batch) in " a href="/console/files" { "Files" } " first." }
            } @else {
                form method="post" action="/console/batches" {
                    (csrf_field(session))
                    label for="batch-file" { "Input file" }
                    select #batch-file name="input_file_id" { @for f in &files {
                        option value=(f.id) selected[picked("input_file_id", &f.id)] { (f.filename) " (" (f.id) ")" } } }
                    label for="batch-endpoint" { "Endpoint" }
                    select #batch-endpoint name="endpoint" { @for e in BATCH_ENDPOINTS {
                        option value=(e) selected[picked("endpoint", e)] { (e) } } }
                    label for="batch-window" { "Completion window" }
                    select #batch-window name="completion_window" { @for w in COMPLETION_WINDOWS { option value=(w) { (w) } } }
                    (form_error("batch-error", form_error_text))
                    button type="submit" { "Start batch" }
                }
            }
        }
        h2 { "Batches of this project" }
        @if batches.is_empty() { p { "No batches yet." } } @else {
            div.scroll { table {
                caption.visually-hidden { "Batches" }
                thead { tr { th scope="col" { "Batch" } th scope="col" { "Endpoint" } th scope="col" { "Status" }
                    th scope="col" { "Progress" } th scope="col" { "Created" } th scope="col" { "Results" }
                    th scope="col" { span.visually-hidden { "Actions" } } } }
                tbody { @for b in &batches {
                    @let c = &b.request_counts;
                    @let done = c.completed + c.failed;
                    tr {
                        td { code { (b.id) } }
                        td { (b.endpoint) }
                        td {
                            span class={ "status " (b.status) } { (b.status) }
                            @if let Some(errors) = b.errors.as_ref().filter(|e| !e.data.is_empty()) {
                                ul.batch-errors { @for e in errors.data.iter().take(ERRORS_SHOWN) { li { (e.message) } }
                                    @if errors.data.len() > ERRORS_SHOWN {
                                        li { "and " (errors.data.len() - ERRORS_SHOWN) " more (the API's " code { "GET /v1/batches/" (b.id) } " lists them)" }
                                    } }
                            }
                        }
                        td {
                            @if c.total > 0 { progress max=(c.total) value=(done.min(c.total)) { (done) " of " (c.total) } br; }
                            (c.completed) " done, " (c.failed) " failed of " (c.total)
                        }
                        td { (layout::time(b.created_at)) }
                        td.actions {
                            @if let Some(f) = &b.output_file_id { a href={ "/console/files/" (f) "/content" } { "Output" } }
                            @if let Some(f) = &b.error_file_id { a href={ "/console/files/" (f) "/content" } { "Errors" } }
                        }
                        td { @if matches!(b.status.as_str(), "validating" | "in_progress") {
                            form.inline method="post" action={ "/console/batches/" (b.id) "/cancel" } data-confirm="Cancel this batch?" {
                                (csrf_field(session))
                                button.danger type="submit" { "Cancel" span.visually-hidden { " " (b.id) } }
                            }
                        } }
                    }
                } }
            } }
        }
    };
    let mut response = render(state, session, Section::Batches, status, "Batches", body).await;
    if batches.iter().any(|b| {
        matches!(
            b.status.as_str(),
            "validating" | "in_progress" | "finalizing" | "cancelling"
        )
    }) {
        // Live progress without JavaScript.
        response
            .headers_mut()
            .insert("refresh", axum::http::HeaderValue::from_static("10"));
    }
    response
}

/// `POST /console/batches` `{csrf, input_file_id, endpoint, completion_window}`.
pub async fn create(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let request = json!({
        "input_file_id": form.get("input_file_id").unwrap_or(""),
        "endpoint": form.get("endpoint").unwrap_or(""),
        "completion_window": form.get("completion_window").unwrap_or(""),
    });
    let made = match hearth_api::parse_json_body(request.to_string().as_bytes()) {
        Ok(request) => {
            api::create(
                State(state.clone()),
                Extension(session.ctx()),
                ApiQuery(ProjectQuery::default()),
                ApiJson(request),
            )
            .await
        }
        Err(e) => Err(HttpError(e)),
    };
    layout::redirect_or(
        made,
        "/console/batches?notice=created",
        |status, message| async move {
            page(
                &state,
                &session,
                status,
                None,
                Refusal::Start(&message),
                &form,
            )
            .await
        },
    )
    .await
}

/// `POST /console/batches/{batch_id}/cancel` `{csrf}`.
pub async fn cancel(
    State(state): State<AppState>,
    session: Session,
    ApiPath(batch_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let cancelled = api::cancel(
        State(state.clone()),
        Extension(session.ctx()),
        ApiPath(batch_id),
    )
    .await;
    layout::redirect_or(
        cancelled,
        "/console/batches?notice=cancelled",
        |status, message| async move {
            page(
                &state,
                &session,
                status,
                None,
                Refusal::Cancel(&message),
                &Form::default(),
            )
            .await
        },
    )
    .await
}
