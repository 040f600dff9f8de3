//! The page around every section: header with the project switcher and
//! sign-out, the navigation, messages; and the responses pages go out in
//! (HTML, never cached, framing and foreign scripts refused).

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use hearth_store::Project;
use maud::{html, Markup, DOCTYPE};

use super::session::Session;
use crate::error::HttpError;
use crate::state::AppState;

/// The sections in the navigation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Keys,
    Projects,
    Files,
    Datasets,
    FineTuning,
    Batches,
    Endpoints,
    Usage,
    Playground,
    Images,
}

const SECTIONS: &[(Section, &str, &str)] = &[
    (Section::Keys, "/console/keys", "API keys"),
    (Section::Projects, "/console/projects", "Projects"),
    (Section::Files, "/console/files", "Files"),
    (Section::Datasets, "/console/datasets", "Datasets"),
    (Section::FineTuning, "/console/fine-tuning", "Fine-tuning"),
    (Section::Batches, "/console/batches", "Batches"),
    (Section::Endpoints, "/console/endpoints", "Endpoints"),
    (Section::Usage, "/console/usage", "Usage"),
    (Section::Playground, "/console/playground", "Playground"),
    (Section::Images, "/console/images", "Images"),
];

/// Whether `section` is in this server's navigation (Images only when it
/// serves an image model).
fn offered(state: &AppState, section: Section) -> bool {
    section != Section::Images || !state.images.is_empty()
}

/// The section at `path`, as a path of ours (for redirects back).
pub fn section_path(path: &str) -> Option<&'static str> {
    SECTIONS.iter().map(|s| s.1).find(|p| *p == path)
}

/// The projects the session's account reaches, the current one first.
pub async fn projects(state: &AppState, session: &Session) -> Result<Vec<Project>, HttpError> {
    let reach = state.store.account_projects(session.account_id()).await?;
    let mut projects: Vec<Project> = state
        .store
        .projects()
        .await?
        .into_iter()
        .filter(|p| reach.contains(&p.id))
        .collect();
    projects.sort_by_key(|p| p.id != session.inner.project_id);
    Ok(projects)
}

/// A whole page of `section` for a signed-in session.
pub async fn render(
    state: &AppState,
    session: &Session,
    section: Section,
    status: StatusCode,
    title: &str,
    body: Markup,
) -> Response {
    let projects = match projects(state, session).await {
        Ok(p) => p,
        Err(e) => return error_page(e),
    };
    let current = projects
        .first()
        .filter(|p| p.id == session.inner.project_id);
    let header = html! {
        header.top {
            a.brand href="/console/keys" { "Hearth console" }
            form.switcher method="post" action="/console/projects/switch" {
                (csrf_field(session))
                input type="hidden" name="back" value=(SECTIONS.iter().find(|s| s.0 == section).map_or("/console/keys", |s| s.1));
                label for="project-switch" { "Project" }
                select #project-switch name="project" {
                    @for p in &projects {
                        option value=(p.id) selected[p.id == session.inner.project_id] { (p.name) }
                    }
                }
                button type="submit" { "Switch" }
            }
            form.signout method="post" action="/console/sign-out" {
                (csrf_field(session))
                span.who title=(session.inner.key_name) { "Signed in with " strong { (session.inner.key_name) }
                    @if session.is_admin() { " (admin)" } }
                button type="submit" { "Sign out" }
            }
        }
        nav aria-label="Sections" {
            ul {
                @for (s, href, label) in SECTIONS.iter().filter(|s| offered(state, s.0)) {
                    li { a href=(href) aria-current=[(*s == section).then_some("page")] { (label) } }
                }
            }
        }
    };
    let page_title = match current {
        Some(p) => format!("{title} · {}", p.name),
        None => title.to_string(),
    };
    respond(
        status,
        document(
            &page_title,
            html! { (header) main #main tabindex="-1" { (body) } },
        ),
    )
}

fn document(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Hearth" }
                link rel="stylesheet" href="/console/assets/console.css";
                link rel="icon" type="image/svg+xml" href="/console/assets/favicon.svg";
                script src="/console/assets/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                (body)
            }
        }
    }
}

/// A page without the signed-in header (sign-in, errors).
pub fn bare_page(status: StatusCode, title: &str, body: Markup) -> Response {
    respond(
        status,
        document(title, html! { main #main tabindex="-1" { (body) } }),
    )
}

/// A short page saying one thing.
pub fn message_page(status: StatusCode, title: &str, message: &str) -> Response {
    bare_page(
        status,
        title,
        html! {
            section.narrow {
                h1 { (title) }
                p role="alert" { (message) }
                p { a href="/console" { "Back to the console" } }
            }
        },
    )
}

/// An error from the API's handlers or the store, as a page.
pub fn error_page(e: HttpError) -> Response {
    let (status, message) = error_text(&e);
    message_page(status, "Something went wrong", &message)
}

/// The status and plain words of an error from the API's handlers. A
/// server error's own words stay in the log, except an overloaded model's
/// (529), which tell the person to try again later.
pub fn error_text(e: &HttpError) -> (StatusCode, String) {
    let status = StatusCode::from_u16(e.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = if status.is_server_error() && status.as_u16() != 529 {
        "The server could not do this just now (its log says why). Try again later.".to_string()
    } else {
        e.0.message()
    };
    (status, message)
}

/// A form action's answer: a redirect to `to` when the API's handler
/// succeeded, else the section's page drawn by `page` with the error's
/// status and plain-words message ([`error_text`]).
pub async fn redirect_or<T, F: std::future::Future<Output = Response>>(
    result: Result<T, HttpError>,
    to: &str,
    page: impl FnOnce(StatusCode, String) -> F,
) -> Response {
    match result {
        Ok(_) => Redirect::to(to).into_response(),
        Err(e) => {
            let (status, message) = error_text(&e);
            page(status, message).await
        }
    }
}

/// The session's CSRF token as a hidden form field.
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf()); }
}

/// An error line under a form (or nothing).
pub fn form_error(id: &str, error: Option<&str>) -> Markup {
    html! { @if let Some(e) = error { p.error id=(id) role="alert" { (e) } } }
}

/// A status line after a change (`?notice=` of a redirect).
pub fn notice(text: Option<&str>) -> Markup {
    html! { @if let Some(t) = text { p.notice role="status" { (t) } } }
}

/// `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(secs: i64) -> String {
    crate::keys_cli::utc(secs)
}

/// Sizes in bytes, KB, MB or GB.
pub fn bytes(n: i64) -> String {
    const UNITS: &[&str] = &["bytes", "KB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The HTML response: never cached, never framed, no foreign scripts.
pub fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    response
}
