//! `/v1/files`: upload (streamed, never held whole), list, retrieve,
//! delete, content, and signed download links.

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::header::{
    CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, HOST, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::TryStreamExt;
use hearth_api::files::{
    bad_purpose, missing_field, purpose_is_jsonl, OBJECT_FILE, OBJECT_FILE_LINK, UPLOAD_PURPOSES,
};
use hearth_api::{
    ApiError, FileDeleted, FileLink, FileList, FileObject, FilesQuery, LinkQuery, ProjectQuery,
};
use hearth_store::files::FileUpload;
use hearth_store::{FileRecord, ListOrder};
use serde::Deserialize;

use crate::auth::RequestContext;
use crate::error::{ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

/// Room for the multipart framing and small fields around the file.
const MULTIPART_OVERHEAD: u64 = 64 * 1024;

fn file_object(f: FileRecord) -> FileObject {
    FileObject {
        id: f.id,
        object: OBJECT_FILE.to_string(),
        bytes: f.bytes as u64,
        created_at: f.created_at,
        filename: f.filename,
        purpose: f.purpose,
        status: f.status,
        status_details: f.status_details,
    }
}

/// 413 at once when a multipart upload's declared length is over `limit`
/// (plus room for the form's framing); the stream is counted as it comes
/// too, for bodies that do not declare their length.
pub fn refuse_declared_over(request: &Request, limit: u64) -> Result<(), HttpError> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit + MULTIPART_OVERHEAD) {
        return Err(hearth_store::StoreError::TooLarge { limit }.into());
    }
    Ok(())
}

/// `POST /v1/files`: multipart with `file` and `purpose`.
pub async fn upload(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    request: Request,
) -> Result<Json<FileObject>, HttpError> {
    let record = receive_upload(&state, request, &ctx.project_id, |_, _| Ok(())).await?;
    Ok(Json(file_object(record)))
}

/// Receives a multipart upload (`file` and `purpose`) into `project_id`:
/// the API's upload and the console's. `on_field` sees every field but
/// `file` with its value as it comes, and `file` (with no value) before
/// its bytes are stored; an error from it refuses the upload with nothing
/// kept.
pub(crate) async fn receive_upload(
    state: &AppState,
    request: Request,
    project_id: &str,
    mut on_field: impl FnMut(&str, &[u8]) -> Result<(), HttpError>,
) -> Result<FileRecord, HttpError> {
    refuse_declared_over(&request, state.max_upload_bytes)?;
    let mut multipart = Multipart::from_request(request, state)
        .await
        .map_err(|_| HttpError(missing_field("file")))?;
    let mut purpose: Option<String> = None;
    let mut upload: Option<(FileUpload, String)> = None;
    let result = read_fields(
        state,
        &mut multipart,
        &mut purpose,
        &mut upload,
        &mut on_field,
    )
    .await;
    let finished = match (result, upload) {
        (Err(e), upload) => Err((e, upload)),
        (Ok(()), None) => Err((HttpError(missing_field("file")), None)),
        (Ok(()), Some(up)) => match purpose {
            None => Err((HttpError(missing_field("purpose")), Some(up))),
            Some(purpose) => Ok((up, purpose)),
        },
    };
    match finished {
        Ok(((up, filename), purpose)) => {
            let jsonl = purpose_is_jsonl(&purpose);
            let record = state
                .store
                .finish_upload(up, project_id, &filename, &purpose, jsonl)
                .await?;
            tracing::info!(file = %record.id, bytes = record.bytes, status = %record.status, "file uploaded");
            Ok(record)
        }
        Err((e, upload)) => {
            if let Some((up, _)) = upload {
                up.abort().await;
            }
            Err(e)
        }
    }
}

/// Reads the form: `purpose` (checked as soon as it comes) and `file`
/// (streamed into the store chunk by chunk); other fields go to `on_field`
/// only.
async fn read_fields(
    state: &AppState,
    multipart: &mut Multipart,
    purpose: &mut Option<String>,
    upload: &mut Option<(FileUpload, String)>,
    on_field: &mut impl FnMut(&str, &[u8]) -> Result<(), HttpError>,
) -> Result<(), HttpError> {
    let interrupted = |e: axum::extract::multipart::MultipartError| {
        HttpError::from(hearth_store::StoreError::Interrupted(e.body_text()))
    };
    let mut small_bytes = 0usize;
    while let Some(mut field) = multipart.next_field().await.map_err(interrupted)? {
        let name = field.name().map(str::to_string);
        match name.as_deref() {
            Some("purpose") => {
                let bytes = small_field(&mut field, &mut small_bytes).await?;
                on_field("purpose", &bytes)?;
                let value = String::from_utf8_lossy(&bytes).trim().to_string();
                if !UPLOAD_PURPOSES.contains(&value.as_str()) {
                    return Err(HttpError(bad_purpose("body", &value, UPLOAD_PURPOSES)));
                }
                *purpose = Some(value);
            }
            Some("file") => {
                on_field("file", &[])?;
                if upload.is_some() {
                    return Err(HttpError(ApiError::with_detail(
                        400,
                        "Send one `file` field per upload.",
                    )));
                }
                let named = field.file_name().filter(|n| !n.is_empty());
                let filename = named.unwrap_or("file").to_string();
                let unnamed = named.is_none();
                let up = upload.insert((
                    state.store.begin_upload(state.max_upload_bytes).await?,
                    filename,
                ));
                while let Some(chunk) = field.chunk().await.map_err(interrupted)? {
                    up.0.write(&chunk).await?;
                }
                // A form's file input with nothing chosen sends an empty
                // part with no file name: no file, not a 0-byte `file`.
                if unnamed && up.0.bytes() == 0 {
                    if let Some((up, _)) = upload.take() {
                        up.abort().await;
                    }
                }
            }
            other => {
                let bytes = small_field(&mut field, &mut small_bytes).await?;
                on_field(other.unwrap_or(""), &bytes)?;
            }
        }
    }
    Ok(())
}

/// Reads a form field other than `file`, counting its bytes into `total`:
/// all such fields together may hold at most [`MULTIPART_OVERHEAD`] bytes
/// (400 beyond), so they are never buffered without bound.
pub(crate) async fn small_field(
    field: &mut axum::extract::multipart::Field<'_>,
    total: &mut usize,
) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| HttpError::from(hearth_store::StoreError::Interrupted(e.body_text())))?
    {
        *total += chunk.len();
        if *total > MULTIPART_OVERHEAD as usize {
            return Err(HttpError(ApiError::with_detail(
                400,
                format!(
                    "The form fields besides `file` may hold at most {MULTIPART_OVERHEAD} bytes."
                ),
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `GET /v1/files`.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(query): ApiQuery<FilesQuery>,
) -> Result<Json<FileList>, HttpError> {
    let limit = query.limit()?;
    let purpose = query.purpose()?;
    let order = match query.order {
        hearth_api::files::Order::Asc => ListOrder::Asc,
        hearth_api::files::Order::Desc => ListOrder::Desc,
    };
    let after = query.after.as_deref().filter(|a| !a.is_empty());
    let (files, has_more) = state
        .store
        .list_files(&ctx.project_id, purpose, after, limit, order)
        .await?;
    Ok(Json(FileList::new(
        files.into_iter().map(file_object).collect(),
        has_more,
    )))
}

/// The file `file_id` in any project the caller may use (the named one
/// when `ai_project_id` is given); else 403, as for a missing file.
async fn caller_file(
    state: &AppState,
    ctx: &RequestContext,
    file_id: &str,
) -> Result<FileRecord, HttpError> {
    let file = state.store.file_by_id(file_id).await?;
    ctx.check_owner(&state.store, &file.project_id, "file")
        .await?;
    Ok(file)
}

/// `GET /v1/files/{file_id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(file_id): ApiPath<String>,
) -> Result<Json<FileObject>, HttpError> {
    let file = caller_file(&state, &ctx, &file_id).await?;
    Ok(Json(file_object(file)))
}

/// `DELETE /v1/files/{file_id}`: the row, then the blob; 409 while a job
/// uses the file.
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(file_id): ApiPath<String>,
) -> Result<Json<FileDeleted>, HttpError> {
    let file = caller_file(&state, &ctx, &file_id).await?;
    state.store.delete_file(&file.project_id, &file.id).await?;
    Ok(Json(FileDeleted {
        id: file_id,
        object: OBJECT_FILE.to_string(),
        deleted: true,
    }))
}

/// `GET /v1/files/{file_id}/content`: the bytes as uploaded, streamed.
pub async fn content(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(file_id): ApiPath<String>,
) -> Result<Response, HttpError> {
    let file = caller_file(&state, &ctx, &file_id).await?;
    stream_content(&state, file).await
}

/// A `Content-Disposition` value naming `filename` (RFC 6266): an ASCII
/// `filename` for old clients (other characters as `_`, quotes and
/// backslashes left out) and, when the name is not plain ASCII, the exact
/// name as `filename*=UTF-8''...` (RFC 5987), which browsers prefer.
pub(crate) fn content_disposition(disposition: &str, filename: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    let ascii: String = filename
        .chars()
        .filter(|c| *c != '"' && *c != '\\')
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if ascii == filename {
        return format!("{disposition}; filename=\"{ascii}\"");
    }
    // RFC 5987's attr-char: letters, digits and these.
    const ATTR: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
    format!(
        "{disposition}; filename=\"{ascii}\"; filename*=UTF-8''{}",
        utf8_percent_encode(filename, ATTR)
    )
}

async fn stream_content(state: &AppState, file: FileRecord) -> Result<Response, HttpError> {
    let stream = state.store.file_content(&file).await?;
    let body = Body::from_stream(stream.map_err(|e| std::io::Error::other(e.to_string())));
    // Generated images (always PNG) are shown by a browser, as OpenAI's
    // image links are; everything else downloads.
    let (kind, disposition) = if file.purpose == hearth_api::images::PURPOSE_IMAGE {
        ("image/png", "inline")
    } else {
        ("application/octet-stream", "attachment")
    };
    Ok((
        [
            (CONTENT_TYPE, kind.to_string()),
            (CONTENT_LENGTH, file.bytes.to_string()),
            (
                CONTENT_DISPOSITION,
                content_disposition(disposition, &file.filename),
            ),
            (X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        ],
        body,
    )
        .into_response())
}

/// The server's address as clients see it: `--public-url`, else from the
/// request's `Host` (and `X-Forwarded-Proto`).
pub fn public_base(state: &AppState, headers: &HeaderMap) -> String {
    match &state.http.public_url {
        Some(url) => url.to_string(),
        None => {
            let host = headers
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .filter(|h| is_host(h))
                .unwrap_or("localhost");
            let scheme = match headers
                .get("x-forwarded-proto")
                .and_then(|h| h.to_str().ok())
            {
                Some("https") => "https",
                _ => "http",
            };
            format!("{scheme}://{host}")
        }
    }
}

/// `GET /v1/files/{file_id}/link`: a URL that downloads the content without
/// a key until it expires (`expires_in` seconds, default an hour).
pub async fn link(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(file_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<LinkQuery>,
    headers: HeaderMap,
) -> Result<Json<FileLink>, HttpError> {
    let expires_in = query.expires_in()?;
    let file = caller_file(&state, &ctx, &file_id).await?;
    let expires_at = hearth_store::ids::now() + expires_in;
    Ok(Json(FileLink {
        object: OBJECT_FILE_LINK.to_string(),
        url: signed_download_url(&state, &headers, &file.id, expires_at),
        id: file.id,
        expires_at,
    }))
}

/// The keyless download URL of `file_id`, signed until `expires_at`.
pub fn signed_download_url(
    state: &AppState,
    headers: &HeaderMap,
    file_id: &str,
    expires_at: i64,
) -> String {
    let signature = state.store.sign_link(file_id, expires_at);
    let base = public_base(state, headers);
    format!("{base}/v1/files/{file_id}/download?expires_at={expires_at}&signature={signature}")
}

/// A `Host` value safe to put in a URL: a name or address and a port.
fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
}

#[derive(Debug, Deserialize)]
pub struct DownloadQuery {
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    signature: Option<String>,
}

/// `GET /v1/files/{file_id}/download?expires_at=&signature=`: no key; the
/// signature is the authority. Expired, tampered or unknown: 403.
pub async fn download(
    State(state): State<AppState>,
    ApiPath(file_id): ApiPath<String>,
    request: Request,
) -> Result<Response, HttpError> {
    let refused = || {
        HttpError(ApiError::forbidden(
            "This download link is invalid or has expired.",
        ))
    };
    let query: DownloadQuery =
        hearth_api::parse_query(request.uri().query()).map_err(|_| refused())?;
    let expires_at = query
        .expires_at
        .and_then(|e| e.parse::<i64>().ok())
        .ok_or_else(refused)?;
    let signature = query.signature.ok_or_else(refused)?;
    if !state.store.verify_link(&file_id, expires_at, &signature) {
        return Err(refused());
    }
    let file = state.store.file_by_id(&file_id).await?;
    stream_content(&state, file).await
}

#[cfg(test)]
mod tests {
    use super::content_disposition;

    #[test]
    fn a_download_keeps_its_name_in_any_script() {
        assert_eq!(
            content_disposition("attachment", "data v2.jsonl"),
            r#"attachment; filename="data v2.jsonl""#
        );
        assert_eq!(
            content_disposition("attachment", "ünï 🚀.jsonl"),
            "attachment; filename=\"_n_ _.jsonl\"; filename*=UTF-8''%C3%BCn%C3%AF%20%F0%9F%9A%80.jsonl"
        );
        // Quotes, backslashes and line breaks never reach the header raw.
        let v = content_disposition("inline", "a\"b\\c\nd.png");
        assert_eq!(
            v,
            "inline; filename=\"abc_d.png\"; filename*=UTF-8''a%22b%5Cc%0Ad.png"
        );
        assert!(axum::http::HeaderValue::from_str(&v).is_ok());
    }
}
