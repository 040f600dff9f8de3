//! Projects: the ones this session's account reaches, switching the
//! console between them, and (admins) creating one through the admin
//! API's own handler.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;
use serde_json::json;

use super::form::{self, Form};
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::Session;
use crate::error::{ApiJson, HttpError};
use crate::state::AppState;

const MAX_NAME: usize = hearth_store::ids::MAX_NAME_CHARS;

/// `GET /console/projects`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let notice = match form::query(&uri).get("notice") {
        Some("created") => Some("Project created; the console now shows it."),
        _ => None,
    };
    page(&state, &session, StatusCode::OK, notice, None).await
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    notice: Option<&str>,
    error: Option<&str>,
) -> Response {
    let projects = match layout::projects(state, session).await {
        Ok(p) => p,
        Err(e) => return layout::error_page(e),
    };
    let body = html! {
        h1 { "Projects" }
        (layout::notice(notice))
        p { "Files, jobs and usage belong to a project. The console shows one at a time." }
        div.scroll { table {
            caption.visually-hidden { "Projects" }
            thead { tr { th scope="col" { "Name" } th scope="col" { "Id" } th scope="col" { "Created" }
                th scope="col" { span.visually-hidden { "Actions" } } } }
            tbody { @for p in &projects { tr {
                td.name { (p.name) }
                td { code { (p.id) } }
                td { (layout::time(p.created_at)) }
                td { @if p.id == session.inner.project_id { "shown now" } @else {
                    form.inline method="post" action="/console/projects/switch" {
                        (csrf_field(session))
                        input type="hidden" name="project" value=(p.id);
                        input type="hidden" name="back" value="/console/projects";
                        button type="submit" { "Show" span.visually-hidden { " " (p.name) } }
                    }
                } }
            } } }
        } }
        @if session.is_admin() {
            section aria-labelledby="new-project" {
                h2 #new-project { "Create a project" }
                form method="post" action="/console/projects" {
                    (csrf_field(session))
                    label for="project-name" { "Name" }
                    input #project-name name="name" required maxlength=(MAX_NAME)
                        aria-describedby=[error.map(|_| "project-error")];
                    (form_error("project-error", error))
                    button type="submit" { "Create project" }
                }
            }
        }
    };
    render(state, session, Section::Projects, status, "Projects", body).await
}

/// `POST /console/projects` `{csrf, name}` (admins).
pub async fn create(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let name = form.get("name").unwrap_or("");
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        let message = format!(
            "Enter a name of 1 to {MAX_NAME} characters, without control characters (tabs, line breaks)."
        );
        return page(
            &state,
            &session,
            StatusCode::BAD_REQUEST,
            None,
            Some(&message),
        )
        .await;
    }
    let made = match serde_json::from_value(json!({ "name": name })) {
        Ok(body) => {
            crate::routes::admin::create_project(
                State(state.clone()),
                Extension(session.ctx()),
                ApiJson(body),
            )
            .await
        }
        Err(_) => Err(HttpError(hearth_api::ApiError::internal())),
    };
    let id = match made {
        Ok(made) => made.0["id"].as_str().unwrap_or("").to_string(),
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            return page(&state, &session, status, None, Some(&message)).await;
        }
    };
    if let Err(e) = state.store.set_console_project(&session.token, &id).await {
        return layout::error_page(e.into());
    }
    Redirect::to("/console/projects?notice=created").into_response()
}

/// `POST /console/projects/switch` `{csrf, project, back?}`.
pub async fn switch(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let project = form.get("project").unwrap_or("");
    let reaches = hearth_store::projects::is_well_formed(project)
        && match state
            .store
            .caller_reaches(&session.inner.caller, project)
            .await
        {
            Ok(r) => r,
            Err(e) => return layout::error_page(e.into()),
        };
    if !reaches {
        return layout::message_page(
            StatusCode::FORBIDDEN,
            "No access",
            "Your key does not reach that project, or it does not exist.",
        );
    }
    if let Err(e) = state
        .store
        .set_console_project(&session.token, project)
        .await
    {
        return layout::error_page(e.into());
    }
    // Back to one of the sections only (never another site).
    let back = form
        .get("back")
        .and_then(layout::section_path)
        .unwrap_or("/console/files");
    Redirect::to(back).into_response()
}
