//! Fine-tuning: the project's jobs, a job created from an uploaded file
//! (the API's own create handler: the same checks), and a job's page with
//! its status, loss chart, checkpoints and events, refreshed while it runs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use hearth_api::fine_tuning::{
    self as ft, FineTuningEvent, FineTuningListQuery, PURPOSE_FINE_TUNE,
};
use hearth_api::{FilesQuery, ProjectQuery};
use maud::{html, Markup};
use serde_json::{json, Value};

use super::chart;
use super::form::Form;
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::routes::{files as files_api, fine_tuning as api};
use crate::state::AppState;

/// Events read for a job's chart (pages of 1000).
const MAX_EVENTS: usize = 20_000;
/// Events listed on a job's page.
const EVENTS_SHOWN: usize = 100;

fn query(limit: i64, after: Option<String>) -> FineTuningListQuery {
    FineTuningListQuery {
        limit: Some(limit),
        after,
        ai_project_id: None,
    }
}

fn terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "cancelled")
}

/// `GET /console/fine-tuning`.
pub async fn list(State(state): State<AppState>, session: Session) -> Response {
    page(&state, &session, StatusCode::OK, None, &Form::default()).await
}

/// A refusal of the form: its words, and the hyperparameter it is about
/// (shown beside that field) if it is about one.
struct Refusal<'a> {
    message: &'a str,
    field: Option<&'a str>,
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    refusal: Option<Refusal<'_>>,
    entered: &Form,
) -> Response {
    let ctx = || Extension(session.ctx());
    let all = axum::http::Uri::from_static("/v1/fine_tuning/jobs");
    let jobs = api::list(State(state.clone()), ctx(), all, ApiQuery(query(50, None))).await;
    let files_query = FilesQuery {
        limit: Some(200),
        purpose: Some(PURPOSE_FINE_TUNE.into()),
        ..Default::default()
    };
    let files = files_api::list(State(state.clone()), ctx(), ApiQuery(files_query)).await;
    let models = api::spec_draft(State(state.clone())).await.0.data;
    let (jobs, files) = match (jobs, files) {
        (Ok(j), Ok(f)) => (j.0.data, f.0.data),
        (Err(e), _) | (_, Err(e)) => return layout::error_page(e),
    };
    // Files whose lines did not check out cannot train.
    let files: Vec<_> = files.into_iter().filter(|f| f.status != "error").collect();
    let picked = |name: &str, value: &str| entered.get(name) == Some(value);
    // Without the form (nothing to offer), its refusal goes at the top.
    let form_drawn = !models.is_empty() && !files.is_empty();
    // A refusal about one of the drawn fields goes beside it, any other
    // under the form.
    let (field_error, error) = match refusal {
        Some(Refusal {
            message,
            field: Some(f),
        }) if form_drawn && has_field(f) => (Some((f, message)), None),
        other => (None, other.map(|r| r.message)),
    };
    let top_error = error.filter(|_| !form_drawn);
    let body = html! {
        h1 { "Fine-tuning" }
        (form_error("page-error", top_error))
        section aria-labelledby="new-job" {
            h2 #new-job { "Start a job" }
            @if models.is_empty() {
                p { "This server serves no model that can be fine-tuned." }
            } @else if files.is_empty() {
                p { "Upload a training file (purpose fine-tune, JSONL) in " a href="/console/files" { "Files" } " first." }
            } @else {
                form method="post" action="/console/fine-tuning" {
                    (csrf_field(session))
                    label for="ft-model" { "Base model" }
                    select #ft-model name="model" { @for m in &models { option value=(m.id) selected[picked("model", &m.id)] { (m.id) } } }
                    label for="ft-training" { "Training file" }
                    select #ft-training name="training_file" { @for f in &files {
                        option value=(f.id) selected[picked("training_file", &f.id)] { (f.filename) " (" (f.id) ")" } } }
                    label for="ft-validation" { "Validation file (optional)" }
                    select #ft-validation name="validation_file" {
                        option value="" { "none" }
                        @for f in &files { option value=(f.id) selected[picked("validation_file", &f.id)] { (f.filename) " (" (f.id) ")" } } }
                    label for="ft-suffix" { "Model name suffix (optional)" }
                    input #ft-suffix name="suffix" maxlength="64" value=(entered.get("suffix").unwrap_or(""));
                    (hyperparameter_fields(entered, field_error))
                    (form_error("job-error", error))
                    button type="submit" { "Start job" }
                }
            }
        }
        h2 { "Jobs of this project" }
        @if jobs.is_empty() { p { "No jobs yet." } } @else {
            div.scroll { table {
                caption.visually-hidden { "Fine-tuning jobs" }
                thead { tr { th scope="col" { "Job" } th scope="col" { "Model" } th scope="col" { "Status" }
                    th scope="col" { "Steps" } th scope="col" { "Created" } th scope="col" { "Finished" } } }
                tbody { @for j in &jobs { tr {
                    td { a href={ "/console/fine-tuning/" (j.id) } { code { (j.id) } } }
                    td { (j.model) }
                    td { span class={ "status " (j.status) } { (j.status) } }
                    td { (j.trained_steps) @if let Some(t) = j.total_steps { " / " (t) } }
                    td { (layout::time(j.created_at)) }
                    td { (j.finished_at.map_or(String::new(), layout::time)) }
                } } }
            } }
        }
    };
    render(
        state,
        session,
        Section::FineTuning,
        status,
        "Fine-tuning",
        body,
    )
    .await
}

/// The hyperparameters the form asks for, as numbers: field, label, the
/// API's default (shown as the placeholder), whether a whole number.
const NUMBERS: &[(&str, &str, f64, bool)] = &[
    ("n_epochs", "Epochs", ft::DEFAULT_N_EPOCHS as f64, true),
    (
        "batch_size",
        "Batch size",
        ft::DEFAULT_BATCH_SIZE as f64,
        true,
    ),
    (
        "learning_rate",
        "Learning rate",
        ft::DEFAULT_LEARNING_RATE,
        false,
    ),
    (
        "context_length",
        "Context length (tokens per example)",
        ft::DEFAULT_CONTEXT_LENGTH as f64,
        true,
    ),
    ("lora_r", "LoRA rank", ft::DEFAULT_LORA_R as f64, true),
];

/// Whether the hyperparameters' fieldset has a field named `name`.
fn has_field(name: &str) -> bool {
    name == "packing" || NUMBERS.iter().any(|(n, ..)| *n == name)
}

/// The hyperparameters' fields; `field_error` (a field's name and what is
/// wrong with it) is shown right after that field, which points to it.
fn hyperparameter_fields(entered: &Form, field_error: Option<(&str, &str)>) -> Markup {
    let packing = entered.get("packing").unwrap_or("");
    let error_of = |name: &str| field_error.filter(|(f, _)| *f == name).map(|(_, m)| m);
    html! {
        fieldset {
            legend { "Hyperparameters (optional)" }
            p.hint { "A field left empty takes the default shown in it." }
            @for (name, label, default, whole) in NUMBERS {
                @let id = format!("ft-{}", name.replace('_', "-"));
                @let error = error_of(name);
                @let error_id = format!("{id}-error");
                label for=(id) { (label) }
                input id=(id) name=(name) type="number" min=[whole.then_some("1")]
                    step=(if *whole { "1" } else { "any" }) placeholder=(default)
                    value=(entered.get(name).unwrap_or(""))
                    aria-invalid=[error.map(|_| "true")]
                    aria-describedby=[error.map(|_| error_id.as_str())];
                (form_error(&error_id, error))
            }
            @let error = error_of("packing");
            label for="ft-packing" { "Packing (short examples share one sequence)" }
            select #ft-packing name="packing" aria-invalid=[error.map(|_| "true")]
                aria-describedby=[error.map(|_| "ft-packing-error")] {
                option value="" { "default (" (if ft::DEFAULT_PACKING { "on" } else { "off" }) ")" }
                option value="true" selected[packing == "true"] { "on" }
                option value="false" selected[packing == "false"] { "off" }
            }
            (form_error("ft-packing-error", error))
        }
    }
}

/// The form's hyperparameters as the API's JSON (only those given), or
/// which one is wrong and why in plain words.
fn hyperparameters(form: &Form) -> Result<serde_json::Map<String, Value>, (&'static str, String)> {
    let mut out = serde_json::Map::new();
    for (name, label, _, whole) in NUMBERS {
        let Some(v) = form.get(name) else { continue };
        let value = if *whole {
            // Any whole number goes to the API, which says its range.
            let digits = v.strip_prefix('-').unwrap_or(v);
            match v.parse::<i64>() {
                Ok(n) => Value::from(n),
                Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                    return Err((*name, format!("{label} is far too large.")))
                }
                Err(_) => return Err((*name, format!("{label} must be a whole number."))),
            }
        } else {
            v.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Value::from)
                .ok_or_else(|| (*name, format!("{label} must be a number, like 0.0001.")))?
        };
        out.insert(name.to_string(), value);
    }
    match form.get("packing") {
        None => {}
        Some(v @ ("true" | "false")) => {
            out.insert("packing".into(), Value::Bool(v == "true"));
        }
        Some(_) => return Err(("packing", "Packing is on, off or the default.".into())),
    }
    Ok(out)
}

/// `POST /console/fine-tuning` `{csrf, model, training_file,
/// validation_file?, suffix?, n_epochs?, batch_size?, learning_rate?,
/// context_length?, lora_r?, packing?}`.
pub async fn create(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let mut request = json!({
        "model": form.get("model").unwrap_or(""),
        "training_file": form.get("training_file").unwrap_or(""),
    });
    if let Some(v) = form.get("validation_file") {
        request["validation_file"] = json!(v);
    }
    if let Some(v) = form.get("suffix") {
        request["suffix"] = json!(v);
    }
    match hyperparameters(&form) {
        Ok(h) if h.is_empty() => {}
        Ok(h) => request["hyperparameters"] = Value::Object(h),
        Err((field, message)) => {
            let refusal = Refusal {
                message: &message,
                field: Some(field),
            };
            return page(
                &state,
                &session,
                StatusCode::BAD_REQUEST,
                Some(refusal),
                &form,
            )
            .await;
        }
    }
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
    match made {
        Ok(job) => Redirect::to(&format!("/console/fine-tuning/{}", job.0.id)).into_response(),
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            // The API names a hyperparameter as `hyperparameters.<name>`.
            let field = e.0.param().and_then(|p| p.strip_prefix("hyperparameters."));
            let refusal = Refusal {
                message: &message,
                field,
            };
            page(&state, &session, status, Some(refusal), &form).await
        }
    }
}

/// Every event of a job (newest first), up to [`MAX_EVENTS`].
async fn all_events(
    state: &AppState,
    session: &Session,
    job_id: &str,
) -> Result<Vec<FineTuningEvent>, HttpError> {
    let mut events = Vec::new();
    let mut after = None;
    loop {
        let page = api::events(
            State(state.clone()),
            Extension(session.ctx()),
            ApiPath(job_id.to_string()),
            ApiQuery(query(1000, after)),
        )
        .await?
        .0;
        events.extend(page.data);
        match (page.has_more, events.last()) {
            (true, Some(last)) if events.len() < MAX_EVENTS => after = Some(last.id.clone()),
            _ => return Ok(events),
        }
    }
}

/// `GET /console/fine-tuning/{job_id}`.
pub async fn job(
    State(state): State<AppState>,
    session: Session,
    ApiPath(job_id): ApiPath<String>,
) -> Response {
    let loaded = async {
        let job = api::retrieve(
            State(state.clone()),
            Extension(session.ctx()),
            ApiPath(job_id.clone()),
        )
        .await?
        .0;
        let events = all_events(&state, &session, &job.id).await?;
        let checkpoints = api::checkpoints(
            State(state.clone()),
            Extension(session.ctx()),
            ApiPath(job.id.clone()),
            ApiQuery(query(100, None)),
        )
        .await?
        .0
        .data;
        Ok::<_, HttpError>((job, events, checkpoints))
    };
    let (job, events, checkpoints) = match loaded.await {
        Ok(loaded) => loaded,
        Err(e) => return layout::error_page(e),
    };
    let points = chart::points(
        events
            .iter()
            .filter(|e| e.kind == "metrics")
            .filter_map(|e| e.data.as_ref()),
    );
    let done = terminal(&job.status);
    let error = job
        .error
        .as_ref()
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            job.error
                .as_ref()
                .filter(|e| !e.is_null())
                .map(Value::to_string)
        });
    let body = html! {
        p { a href="/console/fine-tuning" { "← All jobs" } }
        h1 { "Job " code { (job.id) } }
        dl.facts {
            dt { "Status" } dd { span class={ "status " (job.status) } { (job.status) } @if !done { " (this page refreshes every 5 seconds)" } }
            dt { "Base model" } dd { (job.model) }
            @if let Some(m) = &job.fine_tuned_model { dt { "Fine-tuned model" } dd { code { (m) } } }
            dt { "Progress" } dd {
                @if let Some(total) = job.total_steps.filter(|t| *t > 0) {
                    progress max=(total) value=(job.trained_steps.min(total)) { (job.trained_steps) " of " (total) }
                    " " (job.trained_steps) " of " (total) " steps"
                } @else { (job.trained_steps) " steps" }
            }
            @if let Some(h) = job.hyperparameters.as_object().filter(|h| !h.is_empty()) {
                dt { "Hyperparameters" } dd { (h.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")) }
            }
            dt { "Training file" } dd { code { (job.training_file) } }
            @if let Some(v) = &job.validation_file { dt { "Validation file" } dd { code { (v) } } }
            dt { "Created" } dd { (layout::time(job.created_at)) }
            @if let Some(t) = job.finished_at { dt { "Finished" } dd { (layout::time(t)) } }
            @if let Some(e) = &error { dt { "Error" } dd.error { (e) } }
            @if !job.result_files.is_empty() { dt { "Result files" } dd { ul.plain { @for f in &job.result_files {
                li { a href={ "/console/files/" (f) "/content" } { code { (f) } } } } } } }
        }
        @if !done {
            form method="post" action={ "/console/fine-tuning/" (job.id) "/cancel" } data-confirm="Cancel this job?" {
                (csrf_field(&session))
                button.danger type="submit" { "Cancel job" }
            }
        }
        h2 #loss { "Loss" }
        @match chart::loss_chart(&points) {
            Some(svg) => { (svg) }
            None => { p { "No training steps logged yet." } }
        }
        h2 #checkpoints { "Checkpoints" }
        @if checkpoints.is_empty() { p { "None yet." } } @else { div.scroll { table {
            thead { tr { th scope="col" { "Step" } th scope="col" { "Model" } th scope="col" { "Training loss" } th scope="col" { "Created" } } }
            tbody { @for c in &checkpoints { tr {
                td { (c.step_number) }
                td { code { (c.fine_tuned_model_checkpoint) } }
                td { (c.metrics.get("train_loss").and_then(Value::as_f64).map_or(String::new(), |l| format!("{l:.4}"))) }
                td { (layout::time(c.created_at)) }
            } } }
        } } }
        h2 #events { "Events" }
        div.scroll { table {
            thead { tr { th scope="col" { "Time" } th scope="col" { "Level" } th scope="col" { "Message" } } }
            tbody { @for e in events.iter().take(EVENTS_SHOWN) { tr {
                td { (layout::time(e.created_at)) } td { (e.level) } td { (e.message) }
            } } }
        } }
        @if events.len() > EVENTS_SHOWN { p { "The newest " (EVENTS_SHOWN) " of " (events.len()) " events." } }
    };
    let mut response = render(
        &state,
        &session,
        Section::FineTuning,
        StatusCode::OK,
        "Fine-tuning job",
        body,
    )
    .await;
    if !done {
        // Live status without JavaScript: the browser reloads the page.
        response
            .headers_mut()
            .insert("refresh", axum::http::HeaderValue::from_static("5"));
    }
    response
}

/// `POST /console/fine-tuning/{job_id}/cancel` `{csrf}`.
pub async fn cancel(
    State(state): State<AppState>,
    session: Session,
    ApiPath(job_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    match api::cancel(
        State(state.clone()),
        Extension(session.ctx()),
        ApiPath(job_id),
    )
    .await
    {
        Ok(job) => Redirect::to(&format!("/console/fine-tuning/{}", job.0.id)).into_response(),
        Err(e) => layout::error_page(e),
    }
}
