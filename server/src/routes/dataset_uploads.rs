//! `/v1/datasets/uploads`: multipart dataset uploads. An upload is created
//! with the dataset's name, folder and schema; each part (form field
//! `data`: JSON Lines, CSV or Parquet) is streamed to a temporary file,
//! checked row by row against the schema and stored as Parquet before it
//! is acknowledged; `complete` makes the dataset from a list of parts;
//! `cancel` drops them.

use axum::extract::{FromRequest, Multipart, Request, State};
use axum::{Extension, Json};
use hearth_api::datasets::{
    UploadCompleteRequest, UploadCreateRequest, UploadDataset, UploadInfo, UploadObject,
    UploadPartObject, OBJECT_UPLOAD, OBJECT_UPLOAD_PART,
};
use hearth_api::files::missing_field;
use hearth_api::{ApiError, ProjectQuery};
use hearth_store::datasets::table::PartFormat;
use hearth_store::datasets::{new_part_id, part_blob_key, NewUpload, Upload, UploadStatus};
use hearth_store::StoreError;
use tokio::io::AsyncWriteExt;

use super::datasets::{
    convert_to_parquet, delete_blobs, schema_from_wire, schema_to_wire, RowsFrom,
};
use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

pub fn upload_object(u: Upload) -> UploadObject {
    UploadObject {
        id: u.id,
        object: OBJECT_UPLOAD.to_string(),
        upload_info: UploadInfo {
            status: u.status.as_str().to_string(),
            dataset: UploadDataset {
                name: u.name,
                schema: schema_to_wire(&u.schema),
                folder: u.folder,
                id: u.dataset_id,
            },
            created_at: u.created_at,
            completed_at: u.completed_at,
            error: u.error,
            ai_project_id: u.project_id,
        },
    }
}

/// The upload `upload_id` in any project the caller may use; else 403, as
/// for a missing upload.
async fn caller_upload(
    state: &AppState,
    ctx: &RequestContext,
    upload_id: &str,
) -> Result<Upload, HttpError> {
    let upload = state.store.upload_by_id(upload_id).await?;
    ctx.check_owner(&state.store, &upload.project_id, "upload")
        .await?;
    Ok(upload)
}

/// `POST /v1/datasets/uploads`.
pub async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(request): ApiJson<UploadCreateRequest>,
) -> Result<Json<UploadObject>, HttpError> {
    request.validate()?;
    let schema = schema_from_wire(&request.schema)?;
    let upload = state
        .store
        .create_upload(NewUpload {
            project_id: ctx.project_id.clone(),
            name: request.name,
            folder: request.folder,
            description: request.description,
            schema,
            source: None,
        })
        .await?;
    tracing::info!(upload = %upload.id, "dataset upload created");
    Ok(Json(upload_object(upload)))
}

/// `GET /v1/datasets/uploads/{upload_id}`: the upload record (how an
/// import from object storage went).
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(upload_id): ApiPath<String>,
) -> Result<Json<UploadObject>, HttpError> {
    Ok(Json(upload_object(
        caller_upload(&state, &ctx, &upload_id).await?,
    )))
}

/// `POST /v1/datasets/uploads/{upload_id}/parts`: multipart, the part in
/// field `data`.
pub async fn add_part(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(upload_id): ApiPath<String>,
    request: Request,
) -> Result<Json<UploadPartObject>, HttpError> {
    let upload = caller_upload(&state, &ctx, &upload_id).await?;
    if upload.status != UploadStatus::Pending {
        return Err(StoreError::InUse(format!(
            "The upload `{upload_id}` is {}; it takes no more parts.",
            upload.status.as_str()
        ))
        .into());
    }
    let limit = state.max_upload_bytes;
    super::files::refuse_declared_over(&request, limit)?;
    let mut multipart = Multipart::from_request(request, &state)
        .await
        .map_err(|_| HttpError(missing_field("data")))?;
    let dir = tempfile::tempdir().map_err(StoreError::from)?;
    let input = dir.path().join("part");
    let format = read_part(&mut multipart, &input, limit).await?;
    let output = dir.path().join("part.parquet");
    let schema = upload.schema.clone();
    let stats = convert_to_parquet(input, format, schema, output.clone(), RowsFrom::Part).await?;
    let part_id = new_part_id();
    let key = part_blob_key(&upload.id, &part_id);
    let bytes = state.store.blobs().put_file(&key, &output).await?;
    let part = match state
        .store
        .add_upload_part(
            &upload.id,
            &part_id,
            &key,
            stats.rows as i64,
            bytes as i64,
            state.datasets.max_parts,
        )
        .await
    {
        Ok(part) => part,
        Err(e) => {
            delete_blobs(&state, vec![key]).await;
            return Err(e.into());
        }
    };
    tracing::info!(upload = %upload.id, part = %part.id, rows = part.rows, "dataset part stored");
    Ok(Json(UploadPartObject {
        id: part.id,
        object: OBJECT_UPLOAD_PART.to_string(),
        upload_id: part.upload_id,
        rows: part.rows,
        bytes: part.bytes,
        created_at: part.created_at,
    }))
}

/// Streams form field `data` into `path` (at most `limit` bytes, else
/// 413); its format from its content type and file name. Other fields are
/// skipped, at most 64 KiB of them in all (as for files; 400 beyond).
async fn read_part(
    multipart: &mut Multipart,
    path: &std::path::Path,
    limit: u64,
) -> Result<PartFormat, HttpError> {
    let interrupted = |e: axum::extract::multipart::MultipartError| {
        HttpError::from(StoreError::Interrupted(e.body_text()))
    };
    let mut format = None;
    let mut other_bytes = 0;
    while let Some(mut field) = multipart.next_field().await.map_err(interrupted)? {
        if field.name() != Some("data") {
            super::files::small_field(&mut field, &mut other_bytes).await?;
            continue;
        }
        if format.is_some() {
            return Err(HttpError(ApiError::bad_request(
                Some("data"),
                "Send one `data` field per part.",
            )));
        }
        format = Some(PartFormat::detect(field.content_type(), field.file_name()));
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(StoreError::from)?;
        let mut written = 0u64;
        while let Some(chunk) = field.chunk().await.map_err(interrupted)? {
            written += chunk.len() as u64;
            if written > limit {
                return Err(StoreError::TooLarge { limit }.into());
            }
            file.write_all(&chunk).await.map_err(StoreError::from)?;
        }
        file.flush().await.map_err(StoreError::from)?;
    }
    format.ok_or_else(|| HttpError(missing_field("data")))
}

/// `POST /v1/datasets/uploads/{upload_id}/complete`.
pub async fn complete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(upload_id): ApiPath<String>,
    ApiJson(request): ApiJson<UploadCompleteRequest>,
) -> Result<Json<UploadObject>, HttpError> {
    let upload = caller_upload(&state, &ctx, &upload_id).await?;
    let (upload, dataset, left_out) = match state
        .store
        .complete_upload(&upload.id, &request.part_ids)
        .await
    {
        Ok(done) => done,
        Err(StoreError::Invalid(message)) => {
            return Err(HttpError(ApiError::bad_request(Some("part_ids"), message)))
        }
        Err(e) => return Err(e.into()),
    };
    delete_blobs(&state, left_out).await;
    tracing::info!(upload = %upload.id, dataset = %dataset.id, rows = dataset.row_count, "dataset upload completed");
    Ok(Json(upload_object(upload)))
}

/// `POST /v1/datasets/uploads/{upload_id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(upload_id): ApiPath<String>,
) -> Result<Json<UploadObject>, HttpError> {
    let upload = caller_upload(&state, &ctx, &upload_id).await?;
    let (upload, keys) = state.store.cancel_upload(&upload.id).await?;
    delete_blobs(&state, keys).await;
    tracing::info!(upload = %upload.id, "dataset upload cancelled");
    Ok(Json(upload_object(upload)))
}

/// Ends uploads left `PENDING` longer than the policy's time and deletes
/// their parts; run at start and every hour.
pub async fn expire_stale(state: &AppState) {
    let before = hearth_store::ids::now() - state.datasets.upload_ttl.as_secs() as i64;
    match state.store.expire_uploads(before).await {
        Ok(keys) if keys.is_empty() => {}
        Ok(keys) => {
            tracing::info!(parts = keys.len(), "stale dataset uploads expired");
            delete_blobs(state, keys).await;
        }
        Err(e) => tracing::warn!("expiring stale dataset uploads: {e}"),
    }
}
