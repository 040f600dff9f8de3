//! The web console at `/console`: server-rendered pages (maud) over the
//! same store and route handlers as the HTTP API, with one stylesheet and
//! one small script compiled into the binary. Every page works without
//! JavaScript: forms post, and the server answers with a redirect (or, for
//! a key's one-time value, the page that shows it).
//!
//! A person signs in with a stored API key ([`session`]); the session is a
//! cookie whose token the store keeps hashed, and every form carries the
//! session's CSRF token. Each section calls the API's own handlers with a
//! [`RequestContext`](crate::auth::RequestContext) made from the session,
//! so the console adds no rules of its own beyond who may see which keys.

mod assets;
mod batches;
mod chart;
mod datasets;
mod endpoints;
mod files;
mod fine_tuning;
mod form;
mod images;
mod keys;
mod layout;
mod playground;
mod projects;
mod session;
mod usage;

use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::state::AppState;

pub use chart::loss_chart;

/// The console's routes (no API key: the session cookie is the authority).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(home))
        .route("/console/", get(home))
        .route("/console/assets/console.css", get(assets::css))
        .route("/console/assets/console.js", get(assets::js))
        .route("/console/assets/favicon.svg", get(assets::icon))
        .route(
            "/console/sign-in",
            get(session::sign_in_page).post(session::sign_in),
        )
        .route("/console/sign-out", post(session::sign_out))
        .route("/console/keys", get(keys::list).post(keys::create))
        .route("/console/keys/new", get(keys::confirm_create))
        .route(
            "/console/keys/{key_id}/revoke",
            get(keys::confirm_revoke).post(keys::revoke),
        )
        .route(
            "/console/projects",
            get(projects::list).post(projects::create),
        )
        .route("/console/projects/switch", post(projects::switch))
        .route(
            "/console/files",
            get(files::list)
                .post(files::upload)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/console/files/{file_id}/content", get(files::download))
        .route("/console/files/{file_id}/delete", post(files::delete))
        .route(
            "/console/datasets",
            get(datasets::list)
                .post(datasets::create)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/console/datasets/{dataset_id}", get(datasets::dataset))
        .route(
            "/console/datasets/{dataset_id}/export",
            get(datasets::export),
        )
        .route(
            "/console/datasets/{dataset_id}/delete",
            post(datasets::delete),
        )
        .route(
            "/console/fine-tuning",
            get(fine_tuning::list).post(fine_tuning::create),
        )
        .route("/console/fine-tuning/{job_id}", get(fine_tuning::job))
        .route(
            "/console/fine-tuning/{job_id}/cancel",
            post(fine_tuning::cancel),
        )
        .route("/console/batches", get(batches::list).post(batches::create))
        .route("/console/batches/{batch_id}/cancel", post(batches::cancel))
        .route(
            "/console/endpoints",
            get(endpoints::list).post(endpoints::create),
        )
        .route(
            "/console/endpoints/{endpoint_id}/scale",
            post(endpoints::scale),
        )
        .route(
            "/console/endpoints/{endpoint_id}/delete",
            post(endpoints::delete),
        )
        .route("/console/usage", get(usage::page))
        .route(
            "/console/playground",
            get(playground::page).post(playground::send),
        )
        .route("/console/playground/stream", post(playground::stream))
        .route("/console/images", get(images::page).post(images::create))
}

/// The server's 404: a page under `/console`, else the API's JSON.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    match console_miss(&uri, axum::http::StatusCode::NOT_FOUND) {
        Some(page) => page,
        None => crate::error::not_found().await,
    }
}

/// The server's 405: a page under `/console` (a form's address opened as
/// a link), else the API's JSON.
pub async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    match console_miss(&uri, axum::http::StatusCode::METHOD_NOT_ALLOWED) {
        Some(page) => page,
        None => crate::error::method_not_allowed().await,
    }
}

/// A 404 or 405 under `/console` as a page; `None` elsewhere.
fn console_miss(uri: &axum::http::Uri, status: axum::http::StatusCode) -> Option<Response> {
    let path = uri.path();
    if path != "/console" && !path.starts_with("/console/") {
        return None;
    }
    let (title, message) = if status == axum::http::StatusCode::NOT_FOUND {
        (
            "Page not found",
            "There is no console page at this address.",
        )
    } else {
        (
            "Not a page",
            "This address takes a form's submission and has nothing to show.",
        )
    };
    Some(layout::message_page(status, title, message))
}

/// `/console`: the keys section (or the sign-in page, through it).
async fn home() -> Response {
    Redirect::to("/console/keys").into_response()
}
