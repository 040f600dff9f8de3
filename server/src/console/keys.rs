//! API keys: list, create (name, confirm, the value shown once), revoke
//! (confirm). Admins see and manage every key, made through the admin
//! API's own handler; others see their account's keys and add keys to it.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use hearth_store::{KeyInfo, Project};
use maud::{html, Markup};
use serde_json::json;

use super::form::{self, Form};
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiPath, HttpError};
use crate::state::AppState;

/// Longest key name accepted.
const MAX_NAME: usize = hearth_store::ids::MAX_NAME_CHARS;

/// The keys this session may see.
async fn visible_keys(state: &AppState, session: &Session) -> Result<Vec<KeyInfo>, HttpError> {
    Ok(if session.is_admin() {
        state.store.keys().await?
    } else {
        state.store.account_keys(session.account_id()).await?
    })
}

/// The key `key_id` if this session may manage it (else 403, as missing).
async fn manageable(
    state: &AppState,
    session: &Session,
    key_id: &str,
) -> Result<KeyInfo, HttpError> {
    match state.store.key(key_id).await? {
        Some(k) if session.is_admin() || k.account_id == session.account_id() => Ok(k),
        _ => Err(hearth_store::StoreError::NotFound("key").into()),
    }
}

/// What the create form asks: checked, or the reason it is refused.
struct NewKeyForm {
    name: String,
    project: Option<String>,
    admin: bool,
}

fn read_new(session: &Session, form: &Form, projects: &[Project]) -> Result<NewKeyForm, String> {
    let name = form.get("name").unwrap_or("").to_string();
    if name.is_empty() {
        return Err("Enter a name for the key.".into());
    }
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(format!(
            "A key's name is at most {MAX_NAME} characters, without control characters."
        ));
    }
    if !session.is_admin() {
        return Ok(NewKeyForm {
            name,
            project: None,
            admin: false,
        });
    }
    let project = form
        .get("project")
        .unwrap_or(session.inner.project_id.as_str())
        .to_string();
    if !projects.iter().any(|p| p.id == project) {
        return Err("Choose one of the listed projects.".into());
    }
    Ok(NewKeyForm {
        name,
        project: Some(project),
        admin: form.checked("admin"),
    })
}

/// `GET /console/keys`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let notice = match form::query(&uri).get("notice") {
        Some("revoked") => Some("The key is revoked: requests with it are refused from now on."),
        _ => None,
    };
    page(
        &state,
        &session,
        StatusCode::OK,
        notice,
        None,
        &Form::default(),
    )
    .await
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    notice: Option<&str>,
    error: Option<&str>,
    entered: &Form,
) -> Response {
    let projects = state.store.projects().await.map_err(HttpError::from);
    let (keys, projects) = match (visible_keys(state, session).await, projects) {
        (Ok(k), Ok(p)) => (k, p),
        (Err(e), _) | (_, Err(e)) => return layout::error_page(e),
    };
    let project_name = |id: &str| {
        projects
            .iter()
            .find(|p| p.id == id)
            .map_or(id.to_string(), |p| p.name.clone())
    };
    let body = html! {
        h1 { "API keys" }
        (layout::notice(notice))
        p { @if session.is_admin() { "Every key of this server (you are signed in with an admin key)." }
            @else { "The keys of your account." } }
        div.scroll { table {
            caption.visually-hidden { "API keys" }
            thead { tr { th scope="col" { "Name" } th scope="col" { "Prefix" } th scope="col" { "Project" }
                th scope="col" { "Created" } th scope="col" { "Last used" } th scope="col" { "Status" }
                th scope="col" { span.visually-hidden { "Actions" } } } }
            tbody {
                @for k in &keys {
                    tr {
                        td.name { (k.name) @if k.is_admin { " " span.badge { "admin" } } }
                        td { code { (k.prefix) "…" } }
                        td { (project_name(&k.default_project_id)) }
                        td { (layout::time(k.created_at)) }
                        td { (k.last_used_at.map_or("never".to_string(), layout::time)) }
                        td { @match k.revoked_at { Some(t) => { "revoked " (layout::time(t)) }, None => "active" } }
                        td { @if k.revoked_at.is_none() {
                            a href={ "/console/keys/" (k.id) "/revoke" } { "Revoke" span.visually-hidden { " " (k.name) } }
                        } }
                    }
                }
            }
        } }
        (create_form(session, &projects, error, entered))
    };
    render(state, session, Section::Keys, status, "API keys", body).await
}

fn create_form(
    session: &Session,
    projects: &[Project],
    error: Option<&str>,
    entered: &Form,
) -> Markup {
    html! {
        section aria-labelledby="create-title" {
            h2 #create-title { "Create a key" }
            form method="get" action="/console/keys/new" {
                label for="key-name" { "Name" }
                input #key-name name="name" required maxlength=(MAX_NAME) value=(entered.get("name").unwrap_or(""))
                    aria-describedby=[error.map(|_| "create-error")];
                @if session.is_admin() {
                    label for="key-project" { "Project" }
                    select #key-project name="project" {
                        @for p in projects {
                            option value=(p.id) selected[p.id == entered.get("project").unwrap_or(session.inner.project_id.as_str())] { (p.name) }
                        }
                    }
                    div.check {
                        input #key-admin type="checkbox" name="admin" checked[entered.checked("admin")];
                        label for="key-admin" { "Admin key (manages every project's keys)" }
                    }
                }
                (form_error("create-error", error))
                button type="submit" { "Create key…" }
            }
        }
    }
}

/// `GET /console/keys/new?name=...`: the confirm step.
pub async fn confirm_create(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let entered = form::query(&uri);
    let projects = match state.store.projects().await {
        Ok(p) => p,
        Err(e) => return layout::error_page(e.into()),
    };
    let new = match read_new(&session, &entered, &projects) {
        Ok(new) => new,
        Err(message) => {
            return page(
                &state,
                &session,
                StatusCode::BAD_REQUEST,
                None,
                Some(&message),
                &entered,
            )
            .await
        }
    };
    let project = new
        .project
        .as_deref()
        .unwrap_or(session.inner.caller.default_project_id.as_str());
    let project_name = projects
        .iter()
        .find(|p| p.id == project)
        .map_or(project, |p| p.name.as_str());
    let body = html! {
        h1 { "Create this key?" }
        p { "A new key named " strong { (new.name) } " for the project " strong { (project_name) }
            @if new.admin { ", with admin rights" } "." }
        form method="post" action="/console/keys" {
            (csrf_field(&session))
            input type="hidden" name="name" value=(new.name);
            @if let Some(p) = &new.project { input type="hidden" name="project" value=(p); }
            @if new.admin { input type="hidden" name="admin" value="on"; }
            button type="submit" { "Confirm: create the key" }
            " " a href="/console/keys" { "Cancel" }
        }
    };
    render(
        &state,
        &session,
        Section::Keys,
        StatusCode::OK,
        "Create a key",
        body,
    )
    .await
}

/// `POST /console/keys`: creates the key and shows its value, once.
pub async fn create(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let projects = match state.store.projects().await {
        Ok(p) => p,
        Err(e) => return layout::error_page(e.into()),
    };
    let new = match read_new(&session, &form, &projects) {
        Ok(new) => new,
        Err(message) => {
            return page(
                &state,
                &session,
                StatusCode::BAD_REQUEST,
                None,
                Some(&message),
                &form,
            )
            .await
        }
    };
    let made = if session.is_admin() {
        let body = json!({"name": new.name, "project_id": new.project, "admin": new.admin});
        match serde_json::from_value(body) {
            Ok(body) => crate::routes::admin::create_key(
                State(state.clone()),
                Extension(session.ctx()),
                ApiJson(body),
            )
            .await
            .map(|made| {
                (
                    made.0["key"].as_str().unwrap_or("").to_string(),
                    made.0["prefix"].as_str().unwrap_or("").to_string(),
                )
            }),
            Err(_) => Err(HttpError(hearth_api::ApiError::internal())),
        }
    } else {
        state
            .store
            .add_key(session.account_id(), &new.name)
            .await
            .map(|made| (made.secret, made.info.prefix))
            .map_err(HttpError::from)
    };
    let (secret, prefix) = match made {
        Ok(made) if !made.0.is_empty() => made,
        Ok(_) => return layout::error_page(HttpError(hearth_api::ApiError::internal())),
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            return page(&state, &session, status, None, Some(&message), &form).await;
        }
    };
    let body = html! {
        h1 { "Key created" }
        p.warning role="alert" { strong { "Copy this key now." } " It is shown this once and cannot be viewed later; \
            the list shows only its prefix, " code { (prefix) "…" } " in the table." }
        div.reveal {
            label for="new-key" { "The new key " (new.name) }
            input #new-key type="text" readonly value=(secret) autocomplete="off" spellcheck="false";
            button type="button" data-copy="new-key" hidden { "Copy" }
            span.copied role="status" aria-live="polite" {}
        }
        p { a href="/console/keys" { "Done: back to the keys" } }
    };
    render(
        &state,
        &session,
        Section::Keys,
        StatusCode::OK,
        "Key created",
        body,
    )
    .await
}

/// `GET /console/keys/{key_id}/revoke`: the confirm step.
pub async fn confirm_revoke(
    State(state): State<AppState>,
    session: Session,
    ApiPath(key_id): ApiPath<String>,
) -> Response {
    let key = match manageable(&state, &session, &key_id).await {
        Ok(k) => k,
        Err(e) => return layout::error_page(e),
    };
    let body = html! {
        h1 { "Revoke this key?" }
        p { "The key " strong { (key.name) } " (" code { (key.prefix) "…" } ") will be refused at once by the API \
             and by the console. This cannot be undone." }
        @if own_key(&session, &key.id) {
            p.notice role="status" { "This is the key you are signed in with: revoking it signs you out of the console." }
        }
        form method="post" action={ "/console/keys/" (key.id) "/revoke" } {
            (csrf_field(&session))
            button.danger type="submit" { "Confirm: revoke the key" }
            " " a href="/console/keys" { "Cancel" }
        }
    };
    render(
        &state,
        &session,
        Section::Keys,
        StatusCode::OK,
        "Revoke a key",
        body,
    )
    .await
}

/// `POST /console/keys/{key_id}/revoke`.
pub async fn revoke(
    State(state): State<AppState>,
    session: Session,
    ApiPath(key_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let done = match manageable(&state, &session, &key_id).await {
        Ok(key) if session.is_admin() => crate::routes::admin::revoke_key(
            State(state.clone()),
            Extension(session.ctx()),
            ApiPath(key.id),
        )
        .await
        .map(|_| ()),
        Ok(key) => state
            .store
            .revoke_key(&key.id)
            .await
            .map(|_| ())
            .map_err(HttpError::from),
        Err(e) => Err(e),
    };
    match done {
        Ok(()) => {
            tracing::info!(key = %key_id, "key revoked in the console");
            if own_key(&session, &key_id) {
                // The session went with its key: say so on the sign-in page.
                return Redirect::to("/console/sign-in?revoked").into_response();
            }
            Redirect::to("/console/keys?notice=revoked").into_response()
        }
        Err(e) => layout::error_page(e),
    }
}

/// Whether `key_id` is the key the session signed in with.
fn own_key(session: &Session, key_id: &str) -> bool {
    session.inner.caller.key_id.as_deref() == Some(key_id)
}
