//! Files: the project's files (the Files API's list), upload (the API's
//! own multipart reader, with this session's CSRF token as a field before
//! the file), download and delete (the API's handlers).

use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use hearth_api::files::UPLOAD_PURPOSES;
use hearth_api::FilesQuery;
use maud::html;

use super::form::{self, Form};
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::{self, Session};
use crate::error::{ApiPath, ApiQuery, HttpError};
use crate::routes::files as api;
use crate::state::AppState;

/// Files per page.
const PAGE: i64 = 50;

/// `GET /console/files[?after=ID]`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let query = form::query(&uri);
    let notice = match query.get("notice") {
        Some("uploaded") => Some("File uploaded."),
        Some("uploaded-error") => Some(
            "File uploaded, but its lines did not pass the check for its purpose: its row says why.",
        ),
        Some("deleted") => Some("File deleted."),
        _ => None,
    };
    page(
        &state,
        &session,
        StatusCode::OK,
        notice,
        None,
        query.get("after"),
    )
    .await
}

async fn page(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    notice: Option<&str>,
    error: Option<&str>,
    after: Option<&str>,
) -> Response {
    let query = FilesQuery {
        limit: Some(PAGE),
        after: after.map(str::to_string),
        ..Default::default()
    };
    let listed = api::list(
        State(state.clone()),
        Extension(session.ctx()),
        ApiQuery(query),
    )
    .await;
    let files = match listed {
        Ok(files) => files.0,
        Err(e) => return layout::error_page(e),
    };
    let body = html! {
        h1 { "Files" }
        (layout::notice(notice))
        section aria-labelledby="upload-title" {
            h2 #upload-title { "Upload a file" }
            form #upload method="post" action="/console/files" enctype="multipart/form-data" {
                (csrf_field(session))
                label for="purpose" { "Purpose" }
                select #purpose name="purpose" {
                    @for p in UPLOAD_PURPOSES { option value=(p) selected[*p == "fine-tune"] { (p) } }
                }
                label for="file" { "File" }
                input #file type="file" name="file" required aria-describedby=[error.map(|_| "upload-error")];
                (form_error("upload-error", error))
                progress #upload-progress max="100" value="0" hidden { "0%" }
                button type="submit" { "Upload" }
            }
        }
        h2 { "Files of this project" }
        @if files.data.is_empty() { p { "No files yet." } } @else {
            div.scroll { table {
                caption.visually-hidden { "Files" }
                thead { tr { th scope="col" { "Name" } th scope="col" { "Id" } th scope="col" { "Purpose" }
                    th scope="col" { "Size" } th scope="col" { "Status" } th scope="col" { "Created" }
                    th scope="col" { span.visually-hidden { "Actions" } } } }
                tbody { @for f in &files.data { tr {
                    td.name { (f.filename) }
                    td { code { (f.id) } }
                    td { (f.purpose) }
                    td { (layout::bytes(f.bytes as i64)) }
                    td { (f.status) @if let Some(d) = &f.status_details { br; small { (d) } } }
                    td { (layout::time(f.created_at)) }
                    td.actions {
                        a href={ "/console/files/" (f.id) "/content" } download { "Download" span.visually-hidden { " " (f.filename) } }
                        form.inline method="post" action={ "/console/files/" (f.id) "/delete" }
                            data-confirm={ "Delete " (f.filename) "?" } {
                            (csrf_field(session))
                            button.danger type="submit" { "Delete" span.visually-hidden { " " (f.filename) } }
                        }
                    }
                } } }
            } }
            @if files.has_more { @if let Some(last) = files.data.last() {
                p { a href={ "/console/files?after=" (last.id) } { "Older files" } }
            } }
        }
    };
    render(state, session, Section::Files, status, "Files", body).await
}

/// `POST /console/files`: multipart `csrf`, `purpose`, `file`.
pub async fn upload(State(state): State<AppState>, session: Session, request: Request) -> Response {
    let ctx = session.ctx();
    let mut csrf_ok = false;
    let received = api::receive_upload(&state, request, &ctx.project_id, |name, value| {
        match name {
            "csrf" => {
                let sent = std::str::from_utf8(value).unwrap_or("");
                csrf_ok = session::constant_time_eq(sent.as_bytes(), session.csrf().as_bytes());
            }
            // Nothing is stored before the form's token is known good.
            "file" if !csrf_ok => return Err(HttpError(hearth_api::ApiError::forbidden("csrf"))),
            _ => {}
        }
        Ok(())
    })
    .await;
    match received {
        // Stored either way; a file whose lines failed the purpose's check
        // says so (its row shows why).
        Ok(file) if file.status == "error" => {
            Redirect::to("/console/files?notice=uploaded-error").into_response()
        }
        Ok(_) => Redirect::to("/console/files?notice=uploaded").into_response(),
        Err(_) if !csrf_ok => session::csrf_refused(),
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            page(&state, &session, status, None, Some(&message), None).await
        }
    }
}

/// `GET /console/files/{file_id}/content`: the bytes, as the API sends them.
pub async fn download(
    State(state): State<AppState>,
    session: Session,
    ApiPath(file_id): ApiPath<String>,
) -> Response {
    match api::content(State(state), Extension(session.ctx()), ApiPath(file_id)).await {
        Ok(response) => response,
        Err(e) => layout::error_page(e),
    }
}

/// `POST /console/files/{file_id}/delete` `{csrf}`.
pub async fn delete(
    State(state): State<AppState>,
    session: Session,
    ApiPath(file_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let deleted = api::delete(
        State(state.clone()),
        Extension(session.ctx()),
        ApiPath(file_id),
    )
    .await;
    layout::redirect_or(
        deleted,
        "/console/files?notice=deleted",
        |status, message| async move {
            page(&state, &session, status, None, Some(&message), None).await
        },
    )
    .await
}
