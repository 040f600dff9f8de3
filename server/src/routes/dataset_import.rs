//! Imports from object storage: `POST /v1/datasets` with `source:
//! {type: "object_storage", url, format?}` answers an upload record
//! (`PENDING`) at once and reads the object in the background: download
//! to a temporary file, infer the schema when none was given, check and
//! convert it as a part, then complete the upload (`COMPLETED` with the
//! dataset's id) or fail it (`FAILED` with `error`). `GET
//! /v1/datasets/uploads/{id}` shows how it went.
//!
//! Only URLs under a prefix the operator allowed (`--dataset-import-allow`)
//! are read, and a `file://` URL only where its links lead under such a
//! prefix and outside the server's own files (`crate::local_import`): the
//! server's own files and credentials are not the callers'.

use hearth_api::datasets::{DatasetCreateRequest, DatasetSource, UploadObject};
use hearth_api::ApiError;
use hearth_store::datasets::schema::Column;
use hearth_store::datasets::table::{self, PartFormat};
use hearth_store::datasets::{new_part_id, part_blob_key, NewUpload};
use hearth_store::{Blobs, StoreError};

use super::dataset_uploads::upload_object;
use super::datasets::{convert_to_parquet, delete_blobs, schema_from_wire, RowsFrom};
use crate::error::HttpError;
use crate::local_import::LocalPaths;
use crate::state::AppState;

/// The checked URL and format of an import (400 shape B naming
/// `source...` otherwise).
pub(crate) fn check_source(
    state: &AppState,
    source: &DatasetSource,
) -> Result<(url::Url, PartFormat), HttpError> {
    let bad = |param: &str, message: String| HttpError(ApiError::bad_request(Some(param), message));
    if source.kind != "object_storage" {
        return Err(bad(
            "source.type",
            format!(
                "`source.type` `{}` is unknown; use `object_storage`.",
                source.kind
            ),
        ));
    }
    let url = url::Url::parse(&source.url)
        .map_err(|e| bad("source.url", format!("`source.url` is not a URL: {e}")))?;
    if !matches!(url.scheme(), "file" | "s3") {
        return Err(bad(
            "source.url",
            "`source.url` must be `s3://bucket/key` or `file:///path`.".into(),
        ));
    }
    if url.scheme() == "file"
        && (url.query().is_some() || url.fragment().is_some() || url.path().contains("%00"))
    {
        return Err(bad(
            "source.url",
            "A `file://` URL names a file: no `?` query, `#` fragment or NUL byte.".into(),
        ));
    }
    // On the text as given: parsing removes `.` and `..` segments.
    if dot_segments(&source.url) {
        return Err(bad(
            "source.url",
            "`source.url` must not hold `.` or `..` segments, backslashes or encoded slashes."
                .into(),
        ));
    }
    let allowed = state
        .datasets
        .import_allow
        .iter()
        .any(|prefix| url.as_str().starts_with(prefix.as_str()));
    if !allowed {
        let message = if state.datasets.import_allow.is_empty() {
            "Imports from object storage are off on this server (the operator allows URL \
             prefixes with `--dataset-import-allow`); upload the rows in parts instead."
                .to_string()
        } else {
            format!(
                "`{url}` is not under a prefix this server imports from ({}).",
                state.datasets.import_allow.join(", ")
            )
        };
        return Err(bad("source.url", message));
    }
    let format = match source.format.as_deref() {
        Some(name) => PartFormat::parse(name).ok_or_else(|| {
            bad(
                "source.format",
                format!("`source.format` `{name}` is unknown; use jsonl, csv or parquet."),
            )
        })?,
        None => PartFormat::detect(None, url.path_segments().and_then(|mut s| s.next_back())),
    };
    Ok((url, format))
}

/// Whether the path of the URL text `raw` has a `.` or `..` segment (also
/// percent-encoded), a backslash or an encoded slash or backslash.
fn dot_segments(raw: &str) -> bool {
    let rest = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    let path = rest
        .split(['?', '#'])
        .next()
        .unwrap_or(rest)
        .to_ascii_lowercase();
    path.contains('\\')
        || path.contains("%2f")
        || path.contains("%5c")
        || path.split('/').any(|segment| {
            let segment = segment.replace("%2e", ".");
            segment == "." || segment == ".."
        })
}

/// `POST /v1/datasets` with `source`: the upload record, `PENDING`; the
/// import runs in the background.
pub async fn start(
    state: &AppState,
    project_id: &str,
    request: DatasetCreateRequest,
    source: &DatasetSource,
) -> Result<UploadObject, HttpError> {
    let (url, format) = check_source(state, source)?;
    let schema = match &request.schema {
        Some(schema) => Some(schema_from_wire(schema)?),
        None => None,
    };
    let upload = state
        .store
        .create_upload(NewUpload {
            project_id: project_id.to_string(),
            name: request.name,
            folder: request.folder,
            description: request.description,
            schema: schema.clone().unwrap_or_default(),
            source: Some(serde_json::json!({
                "type": "object_storage",
                "url": source.url,
                "format": format.as_str(),
            })),
        })
        .await?;
    tracing::info!(upload = %upload.id, url = %url, "dataset import queued");
    // A node's import worker (this one's, woken now, or any other's on the
    // same store) claims and reads it.
    state.datasets.import_wake.notify_one();
    Ok(upload_object(upload))
}

/// Reads, checks and stores the object, then completes the upload unless
/// this node lost its claim meanwhile (`Ok(false)`: what it stored is
/// deleted); the error says what went wrong, for the upload's `error`.
pub(crate) async fn run(
    state: &AppState,
    upload_id: &str,
    url: &url::Url,
    format: PartFormat,
    schema: Option<Vec<Column>>,
) -> Result<bool, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let input = dir.path().join("object");
    if url.scheme() == "file" {
        let paths = LocalPaths {
            allow: state.datasets.import_allow.to_vec(),
            private: state.datasets.private_paths.to_vec(),
        };
        let (url, input, limit) = (url.clone(), input.clone(), state.max_upload_bytes);
        tokio::task::spawn_blocking(move || paths.download(&url, &input, limit))
            .await
            .map_err(|e| e.to_string())??;
    } else {
        Blobs::download_url(url, &input, state.max_upload_bytes)
            .await
            .map_err(|e| match e {
                StoreError::NotFound(_) => format!("`{url}` does not exist"),
                e => format!("reading `{url}`: {e}"),
            })?;
    }
    let schema = match schema {
        Some(schema) => schema,
        None => {
            let path = input.clone();
            let inferred = tokio::task::spawn_blocking(move || table::infer_schema(&path, format))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot infer a schema: {e}"))?;
            state
                .store
                .set_upload_schema(upload_id, &inferred)
                .await
                .map_err(|e| e.to_string())?;
            inferred
        }
    };
    let output = dir.path().join("object.parquet");
    let stats = convert_to_parquet(input, format, schema, output.clone(), RowsFrom::Import)
        .await
        .map_err(|e| e.0.message())?;
    let part_id = new_part_id();
    let key = part_blob_key(upload_id, &part_id);
    let bytes = state
        .store
        .blobs()
        .put_file(&key, &output)
        .await
        .map_err(|e| e.to_string())?;
    let stored = state
        .store
        .add_upload_part(
            upload_id,
            &part_id,
            &key,
            stats.rows as i64,
            bytes as i64,
            i64::MAX,
        )
        .await;
    if let Err(e) = stored {
        delete_blobs(state, vec![key]).await;
        return Err(e.to_string());
    }
    let still_ours = state
        .store
        .renew_import(upload_id, &state.node.worker_id())
        .await
        .map_err(|e| e.to_string())?;
    if !still_ours {
        delete_blobs(state, vec![key]).await;
        return Ok(false);
    }
    // Parts an earlier attempt stored before its node died are left out,
    // and their blobs deleted.
    let (upload, dataset, left_out) = state
        .store
        .complete_upload(upload_id, &[part_id])
        .await
        .map_err(|e| e.to_string())?;
    delete_blobs(state, left_out).await;
    tracing::info!(upload = %upload.id, dataset = %dataset.id, rows = dataset.row_count, "dataset imported");
    Ok(true)
}
