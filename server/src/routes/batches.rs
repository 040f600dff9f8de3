//! `/v1/batches`: create, list, retrieve and cancel batches.
//!
//! Creation checks what the request shows and the input file (the
//! project's, purpose `batch`, not marked `error`), then stores the batch
//! `validating`; the batch worker (hearth-jobs) claims it, checks every line
//! and runs it (see `crate::batch_endpoints`). Lists and creation work in
//! the caller's project; by-id routes find the batch in any project the
//! caller may use, and another account's batch is 403 like a missing one.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::batches::{
    window_secs, BatchCreateRequest, BatchErrors, BatchList, BatchListQuery, BatchObject,
    BatchRequestCounts, OverrideSettings, OBJECT_BATCH, PURPOSE_BATCH,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_store::{Batch, NewBatch, StoreError};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

/// The batch as the API shows it.
pub fn batch_object(b: Batch) -> BatchObject {
    BatchObject {
        id: b.id,
        object: OBJECT_BATCH.to_string(),
        endpoint: b.endpoint,
        errors: b
            .errors
            .and_then(|e| serde_json::from_value(e).ok())
            .map(BatchErrors::new),
        input_file_id: b.input_file_id,
        completion_window: b.completion_window,
        status: b.status.as_str().to_string(),
        output_file_id: b.output_file_id,
        error_file_id: b.error_file_id,
        created_at: b.created_at,
        in_progress_at: b.in_progress_at,
        expires_at: Some(b.expires_at),
        finalizing_at: b.finalizing_at,
        completed_at: b.completed_at,
        failed_at: b.failed_at,
        expired_at: b.expired_at,
        cancelling_at: b.cancelling_at,
        cancelled_at: b.cancelled_at,
        request_counts: BatchRequestCounts {
            total: b.total,
            completed: b.completed,
            failed: b.failed,
        },
        metadata: b.metadata,
        override_settings: b
            .override_settings
            .and_then(|o| serde_json::from_value::<OverrideSettings>(o).ok()),
    }
}

/// The input file: the project's, purpose `batch`, not marked `error`
/// (400 shape B naming `input_file_id` otherwise).
async fn check_input_file(
    state: &AppState,
    project_id: &str,
    file_id: &str,
) -> Result<(), HttpError> {
    let bad = |message: String| HttpError(ApiError::bad_request(Some("input_file_id"), message));
    let file = match state.store.file(project_id, file_id).await {
        Ok(file) => file,
        Err(StoreError::NotFound(_)) => {
            return Err(bad(format!(
                "The file `{file_id}` does not exist in this project."
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if file.purpose != PURPOSE_BATCH {
        return Err(bad(format!(
            "The file `{file_id}` has purpose `{}`; a batch needs purpose `{PURPOSE_BATCH}`.",
            file.purpose
        )));
    }
    if file.status == hearth_store::FileStatus::Error.as_str() {
        return Err(bad(format!(
            "The file `{file_id}` is not valid JSONL: {}",
            file.status_details
                .as_deref()
                .unwrap_or("it failed its check")
        )));
    }
    Ok(())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, HttpError> {
    serde_json::to_value(value).map_err(|_| HttpError(ApiError::internal()))
}

/// `POST /v1/batches`.
pub async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(request): ApiJson<BatchCreateRequest>,
) -> Result<Json<BatchObject>, HttpError> {
    request.validate()?;
    check_input_file(&state, &ctx.project_id, &request.input_file_id).await?;
    let window = window_secs(&request.completion_window).unwrap_or(86_400);
    let metadata = request.metadata.as_ref().map(to_json).transpose()?;
    let override_settings = request
        .override_settings
        .as_ref()
        .filter(|o| !o.is_empty())
        .map(to_json)
        .transpose()?;
    let batch = state
        .store
        .create_batch(NewBatch {
            project_id: ctx.project_id.clone(),
            endpoint: request.endpoint,
            completion_window: request.completion_window,
            input_file_id: request.input_file_id,
            metadata,
            override_settings,
            expires_at: hearth_store::ids::now() + window,
        })
        .await?;
    tracing::info!(batch = %batch.id, endpoint = %batch.endpoint, "batch created");
    Ok(Json(batch_object(batch)))
}

/// `GET /v1/batches`: newest first.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(query): ApiQuery<BatchListQuery>,
) -> Result<Json<BatchList>, HttpError> {
    let limit = query.limit()?;
    let (batches, has_more) = state
        .store
        .list_batches(&ctx.project_id, limit, query.after(), query.input_file_id())
        .await?;
    Ok(Json(BatchList::new(
        batches.into_iter().map(batch_object).collect(),
        has_more,
    )))
}

/// The batch `batch_id` in any project the caller may use (the named one
/// when `ai_project_id` is given); else 403, as for a missing batch.
async fn caller_batch(
    state: &AppState,
    ctx: &RequestContext,
    batch_id: &str,
) -> Result<Batch, HttpError> {
    let batch = state.store.batch_by_id(batch_id).await?;
    ctx.check_owner(&state.store, &batch.project_id, "batch")
        .await?;
    Ok(batch)
}

/// `GET /v1/batches/{batch_id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(batch_id): ApiPath<String>,
) -> Result<Json<BatchObject>, HttpError> {
    Ok(Json(batch_object(
        caller_batch(&state, &ctx, &batch_id).await?,
    )))
}

/// `POST /v1/batches/{batch_id}/cancel`: the batch comes back `cancelling`
/// (its worker drops the requests in flight, writes the results so far and
/// ends it `cancelled`), or `cancelled` at once when no worker has it yet.
/// A batch already over: 400 shape B.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(batch_id): ApiPath<String>,
) -> Result<Json<BatchObject>, HttpError> {
    let batch = caller_batch(&state, &ctx, &batch_id).await?;
    match state.store.cancel_batch(&batch.project_id, &batch.id).await {
        Ok(batch) => {
            tracing::info!(batch = %batch.id, status = %batch.status, "batch cancel requested");
            Ok(Json(batch_object(batch)))
        }
        Err(StoreError::Invalid(message)) => Err(HttpError(ApiError::bad_request(None, message))),
        Err(e) => Err(e.into()),
    }
}
