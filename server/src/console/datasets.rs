//! Datasets: the project's datasets (the API's list); creating one from a
//! file through the API's upload handlers (an upload with the schema read
//! from the file's first rows, the file as its one part, complete); a
//! dataset's rows page by page (the API's content route); export (the
//! API's stream) and delete.

use std::path::Path;

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartError;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{Extensions, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use futures_util::StreamExt;
use hearth_api::datasets::{
    ColumnTypeName, ContentQuery, DatasetListQuery, ExportFormat, ExportQuery, SchemaColumn,
    UploadCompleteRequest, UploadCreateRequest,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_store::datasets::table::{self, PartFormat};
use hearth_store::StoreError;
use maud::html;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::form::{self, Form};
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::{self, Session};
use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::routes::dataset_uploads as uploads;
use crate::routes::datasets::{self as api, schema_to_wire};
use crate::state::AppState;

/// Datasets per page of the list.
const PAGE: i64 = 50;
/// Rows per page of a dataset.
const ROWS: i64 = 50;
/// The boundary of the part handed to the API's upload handler.
const BOUNDARY: &str = "hearth-console-dataset-part";

/// `GET /console/datasets[?after=ID]`.
pub async fn list(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let query = form::query(&uri);
    let notice = match query.get("notice") {
        Some("created") => Some("Dataset created."),
        Some("deleted") => Some("Dataset deleted."),
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
    let query = DatasetListQuery {
        limit: Some(PAGE),
        after: after.map(str::to_string),
        ..Default::default()
    };
    let datasets = match api::list(st(state), cx(session), ApiQuery(query)).await {
        Ok(list) => list.0,
        Err(e) => return layout::error_page(e),
    };
    let body = html! {
        h1 { "Datasets" }
        (layout::notice(notice))
        section aria-labelledby="create-title" {
            h2 #create-title { "Create a dataset from a file" }
            form #dataset-create method="post" action="/console/datasets" enctype="multipart/form-data" {
                (csrf_field(session))
                label for="dataset-name" { "Name" }
                input #dataset-name type="text" name="name" required;
                label for="dataset-file" { "File (JSON Lines, CSV or Parquet)" }
                input #dataset-file type="file" name="file" required
                    accept=".jsonl,.ndjson,.json,.csv,.parquet" aria-describedby="dataset-file-help";
                p #dataset-file-help { small { "The columns and their types are read from the file's first rows, unless you give them below." } }
                label for="dataset-schema" { "Columns (optional)" }
                input #dataset-schema type="text" name="schema" placeholder="prompt:string, score:float"
                    aria-describedby="dataset-schema-help";
                p #dataset-schema-help { small { "Name:type pairs separated by commas; types: string, integer, float, boolean, json." } }
                label for="dataset-folder" { "Folder (optional)" }
                input #dataset-folder type="text" name="folder";
                label for="dataset-description" { "Description (optional)" }
                input #dataset-description type="text" name="description";
                (form_error("create-error", error))
                button type="submit" { "Create" }
            }
        }
        h2 { "Datasets of this project" }
        @if datasets.data.is_empty() { p { "No datasets yet." } } @else {
            div.scroll { table {
                caption.visually-hidden { "Datasets" }
                thead { tr { th scope="col" { "Name" } th scope="col" { "Id" } th scope="col" { "Rows" }
                    th scope="col" { "Size" } th scope="col" { "Created" }
                    th scope="col" { span.visually-hidden { "Actions" } } } }
                tbody { @for d in &datasets.data { tr {
                    td.name { a href={ "/console/datasets/" (d.id) } { (d.name) } }
                    td { code { (d.id) } }
                    td { (d.row_count) }
                    td { (layout::bytes(d.bytes)) }
                    td { (layout::time(d.created_at)) }
                    td.actions {
                        a href={ "/console/datasets/" (d.id) "/export?format=csv" } download { "CSV" span.visually-hidden { " of " (d.name) } }
                        " "
                        a href={ "/console/datasets/" (d.id) "/export?format=jsonl" } download { "JSON Lines" span.visually-hidden { " of " (d.name) } }
                    }
                } } }
            } }
            @if datasets.has_more { @if let Some(last) = datasets.data.last() {
                p { a href={ "/console/datasets?after=" (last.id) } { "More datasets" } }
            } }
        }
    };
    render(state, session, Section::Datasets, status, "Datasets", body).await
}

fn st(state: &AppState) -> State<AppState> {
    State(state.clone())
}

fn cx(session: &Session) -> Extension<RequestContext> {
    Extension(session.ctx())
}

/// The page again with the API's words for `e`.
async fn failed(state: &AppState, session: &Session, e: HttpError) -> Response {
    let (status, message) = layout::error_text(&e);
    page(state, session, status, None, Some(&message), None).await
}

/// `POST /console/datasets`: multipart `csrf`, `name`, `file`.
pub async fn create(State(state): State<AppState>, session: Session, request: Request) -> Response {
    // The console's route lifts the body limit; the API's part reader sees
    // the same.
    let extensions = request.extensions().clone();
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => return layout::error_page(StoreError::from(e).into()),
    };
    let path = dir.path().join("part");
    let (name, format, extra) = match receive(&state, &session, request, &path).await {
        Ok(received) => received,
        Err(None) => return session::csrf_refused(),
        Err(Some(e)) => return failed(&state, &session, e).await,
    };
    match store(&state, &session, name, format, extra, &path, extensions).await {
        Ok(()) => Redirect::to("/console/datasets?notice=created").into_response(),
        Err(e) => failed(&state, &session, e).await,
    }
}

/// Reads the form: `csrf` first (nothing else is read before it is known
/// good), `name`, and `file` streamed to `path` (at most the upload
/// limit). `Err(None)`: the token is missing or wrong.
async fn receive(
    state: &AppState,
    session: &Session,
    request: Request,
    path: &Path,
) -> Result<(String, PartFormat, Extra), Option<HttpError>> {
    let bad = |message: String| Some(HttpError(ApiError::bad_request(Some("file"), message)));
    let interrupted =
        |e: MultipartError| Some(HttpError::from(StoreError::Interrupted(e.body_text())));
    let io = |e: std::io::Error| Some(HttpError::from(StoreError::from(e)));
    let mut multipart = Multipart::from_request(request, state)
        .await
        .map_err(|e| bad(format!("The form could not be read: {}", e.body_text())))?;
    let (mut csrf_ok, mut name, mut format) = (false, String::new(), None);
    let mut extra = Extra::default();
    while let Some(mut field) = multipart.next_field().await.map_err(interrupted)? {
        let field_name = field.name().unwrap_or("").to_string();
        if field_name != "csrf" && !csrf_ok {
            return Err(None);
        }
        match field_name.as_str() {
            "csrf" => {
                let sent = field.text().await.map_err(interrupted)?;
                csrf_ok = session::constant_time_eq(sent.as_bytes(), session.csrf().as_bytes());
                if !csrf_ok {
                    return Err(None);
                }
            }
            "name" => name = field.text().await.map_err(interrupted)?.trim().to_string(),
            "schema" | "folder" | "description" => {
                let text = field.text().await.map_err(interrupted)?.trim().to_string();
                let slot = match field_name.as_str() {
                    "schema" => &mut extra.schema,
                    "folder" => &mut extra.folder,
                    _ => &mut extra.description,
                };
                *slot = Some(text).filter(|t| !t.is_empty());
            }
            "file" => {
                // A browser sends an empty part with no name when no file
                // was chosen: that is "no file", not an empty one.
                let chosen = field.file_name().is_some_and(|n| !n.is_empty());
                format =
                    chosen.then(|| PartFormat::detect(field.content_type(), field.file_name()));
                let mut file = tokio::fs::File::create(path).await.map_err(io)?;
                let limit = state.max_upload_bytes;
                let mut written = 0u64;
                while let Some(chunk) = field.chunk().await.map_err(interrupted)? {
                    written += chunk.len() as u64;
                    if written > limit {
                        return Err(Some(StoreError::TooLarge { limit }.into()));
                    }
                    file.write_all(&chunk).await.map_err(io)?;
                }
                file.flush().await.map_err(io)?;
            }
            _ => {}
        }
    }
    if !csrf_ok {
        return Err(None);
    }
    let format = format.ok_or_else(|| bad("Choose a file.".to_string()))?;
    Ok((name, format, extra))
}

/// The form's optional fields.
#[derive(Default)]
struct Extra {
    /// `name:type, ...`: the columns, instead of reading them from the file.
    schema: Option<String>,
    folder: Option<String>,
    description: Option<String>,
}

/// `name:type, name:type` as the API's schema (the API checks the names
/// and types).
fn parse_schema(text: &str) -> Result<Vec<SchemaColumn>, HttpError> {
    text.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| match c.split_once(':') {
            Some((name, ty)) => Ok(SchemaColumn {
                name: name.trim().to_string(),
                ty: ColumnTypeName {
                    name: ty.trim().to_string(),
                },
            }),
            None => Err(HttpError(ApiError::bad_request(
                Some("schema"),
                format!("`{c}` is not `name:type` (for example `prompt:string`)."),
            ))),
        })
        .collect()
}

/// The API's upload: created with the schema read from the file, the file
/// as its one part, completed (or cancelled when a step fails).
async fn store(
    state: &AppState,
    session: &Session,
    name: String,
    format: PartFormat,
    extra: Extra,
    path: &Path,
    extensions: Extensions,
) -> Result<(), HttpError> {
    let schema = match &extra.schema {
        Some(text) => parse_schema(text)?,
        None => {
            let input = path.to_path_buf();
            let columns = tokio::task::spawn_blocking(move || table::infer_schema(&input, format))
                .await
                .map_err(|_| HttpError(ApiError::internal()))?
                .map_err(|e| {
                    HttpError(ApiError::bad_request(
                        Some("file"),
                        format!("Cannot read the file's columns: {e}"),
                    ))
                })?;
            schema_to_wire(&columns)
        }
    };
    let upload = uploads::create(
        st(state),
        cx(session),
        ApiQuery(ProjectQuery::default()),
        ApiJson(UploadCreateRequest {
            name,
            folder: extra.folder,
            description: extra.description,
            schema,
        }),
    )
    .await?
    .0;
    let done = match add_part(state, session, &upload.id, format, path, extensions).await {
        Ok(part_id) => uploads::complete(
            st(state),
            cx(session),
            ApiPath(upload.id.clone()),
            ApiJson(UploadCompleteRequest {
                part_ids: vec![part_id],
            }),
        )
        .await
        .map(|_| ()),
        Err(e) => Err(e),
    };
    if done.is_err() {
        let _ = uploads::cancel(st(state), cx(session), ApiPath(upload.id)).await;
    }
    done
}

/// The file at `path` as the API's multipart part `data`, streamed.
async fn add_part(
    state: &AppState,
    session: &Session,
    upload_id: &str,
    format: PartFormat,
    path: &Path,
    extensions: Extensions,
) -> Result<String, HttpError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(StoreError::from)?;
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"data\"; filename=\"part.{}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n",
        format.as_str()
    );
    let chunks = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let body =
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(head)) })
            .chain(chunks)
            .chain(futures_util::stream::once(async {
                Ok(Bytes::from(format!("\r\n--{BOUNDARY}--\r\n")))
            }));
    let mut request = axum::http::Request::builder()
        .method("POST")
        .header(
            CONTENT_TYPE,
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(Body::from_stream(body))
        .map_err(|_| HttpError(ApiError::internal()))?;
    *request.extensions_mut() = extensions;
    let part = uploads::add_part(
        st(state),
        cx(session),
        ApiPath(upload_id.to_string()),
        request,
    )
    .await?;
    Ok(part.0.id)
}

/// A cell as text: strings as they are, null empty, the rest as JSON.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// `GET /console/datasets/{dataset_id}[?offset=N]`: the dataset and a page
/// of its rows.
pub async fn dataset(
    State(state): State<AppState>,
    session: Session,
    ApiPath(dataset_id): ApiPath<String>,
    uri: Uri,
) -> Response {
    let offset = match form::query(&uri).get("offset").map(str::parse::<i64>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return layout::message_page(
                StatusCode::BAD_REQUEST,
                "No such page",
                "The page's `offset` must be a whole number.",
            )
        }
    };
    let retrieved = api::retrieve(st(&state), cx(&session), ApiPath(dataset_id.clone())).await;
    let d = match retrieved {
        Ok(d) => d.0,
        Err(e) => return layout::error_page(e),
    };
    let query = ContentQuery {
        limit: Some(ROWS),
        offset: Some(offset),
    };
    let content = match api::content(
        st(&state),
        cx(&session),
        ApiPath(dataset_id),
        ApiQuery(query),
    )
    .await
    {
        Ok(c) => c.0,
        Err(e) => return layout::error_page(e),
    };
    let shown = content.data.len() as i64;
    let body = html! {
        p { a href="/console/datasets" { "All datasets" } }
        h1 { (d.name) }
        dl {
            dt { "Id" } dd { code { (d.id) } }
            dt { "Rows" } dd { (d.row_count) }
            dt { "Size" } dd { (layout::bytes(d.bytes)) }
            dt { "Created" } dd { (layout::time(d.created_at)) }
            @if let Some(desc) = &d.description { dt { "Description" } dd { (desc) } }
        }
        p.actions {
            a href={ "/console/datasets/" (d.id) "/export?format=csv" } download { "Export as CSV" }
            " "
            a href={ "/console/datasets/" (d.id) "/export?format=jsonl" } download { "Export as JSON Lines" }
        }
        form method="post" action={ "/console/datasets/" (d.id) "/delete" } data-confirm={ "Delete " (d.name) "?" } {
            (csrf_field(&session))
            button.danger type="submit" { "Delete this dataset" }
        }
        h2 { "Rows" }
        @if content.data.is_empty() { p { "No rows here." } } @else {
            p { "Rows " (offset + 1) " to " (offset + shown) " of " (content.total) "." }
            div.scroll { table {
                caption.visually-hidden { "Rows of " (d.name) }
                thead { tr { @for c in &d.schema { th scope="col" { (c.name) br; small { (c.ty.name) } } } } }
                tbody { @for row in &content.data { tr {
                    @for c in &d.schema { td { (cell(row.get(&c.name))) } }
                } } }
            } }
        }
        nav aria-label="Pages of rows" { ul {
            @if offset > 0 {
                li { a rel="prev" href={ "/console/datasets/" (d.id) "?offset=" ((offset - ROWS).max(0)) } { "Previous rows" } }
            }
            @if offset + shown < content.total {
                li { a rel="next" href={ "/console/datasets/" (d.id) "?offset=" (offset + shown) } { "Next rows" } }
            }
        } }
    };
    render(
        &state,
        &session,
        Section::Datasets,
        StatusCode::OK,
        &d.name,
        body,
    )
    .await
}

/// `GET /console/datasets/{dataset_id}/export?format=csv|jsonl`: the API's
/// stream, as it is read.
pub async fn export(
    State(state): State<AppState>,
    session: Session,
    ApiPath(dataset_id): ApiPath<String>,
    uri: Uri,
) -> Response {
    let format = match form::query(&uri).get("format") {
        Some("csv") => ExportFormat::Csv,
        None | Some("jsonl") => ExportFormat::Jsonl,
        Some(_) => {
            return layout::message_page(
                StatusCode::BAD_REQUEST,
                "Unknown format",
                "A dataset exports as CSV (`format=csv`) or JSON Lines (`format=jsonl`).",
            )
        }
    };
    let query = ExportQuery {
        format,
        columns: None,
        limit: None,
    };
    match api::export(
        st(&state),
        cx(&session),
        ApiPath(dataset_id),
        ApiQuery(query),
    )
    .await
    {
        Ok(response) => response,
        Err(e) => layout::error_page(e),
    }
}

/// `POST /console/datasets/{dataset_id}/delete` `{csrf}`.
pub async fn delete(
    State(state): State<AppState>,
    session: Session,
    ApiPath(dataset_id): ApiPath<String>,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    match api::delete(st(&state), cx(&session), ApiPath(dataset_id)).await {
        Ok(_) => Redirect::to("/console/datasets?notice=deleted").into_response(),
        Err(e) => failed(&state, &session, e).await,
    }
}
