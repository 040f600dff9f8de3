//! `/v1/datasets`: create (rows inline), list, retrieve, patch, delete,
//! content pages, streamed exports and query templates. Datasets are
//! Parquet parts in the blob store (`hearth_store::datasets`); lists and
//! creation work in the caller's project, by-id routes find the dataset in
//! any project the caller may use (another account's: 403 like a missing
//! one).

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hearth_api::datasets::{
    ColumnTypeName, ContentQuery, DatasetContent, DatasetCreateRequest, DatasetDeleted,
    DatasetList, DatasetListQuery, DatasetObject, DatasetPatchRequest, DatasetSortBy, ExportFormat,
    ExportQuery, QueryTemplates, SchemaColumn, SortOrder, OBJECT_DATASET, OBJECT_DATASET_DELETED,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_store::datasets::schema::{check_schema, Column, ColumnType};
use hearth_store::datasets::table::{self, PartError, PartFormat, PartStats};
use hearth_store::datasets::{Dataset, DatasetPatch, DatasetSort, NewDataset, StoredPart};
use hearth_store::StoreError;
use serde_json::{json, Map, Value};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

mod templates;

/// The schema as the API shows it.
pub fn schema_to_wire(columns: &[Column]) -> Vec<SchemaColumn> {
    columns
        .iter()
        .map(|c| SchemaColumn {
            name: c.name.clone(),
            ty: ColumnTypeName {
                name: c.ty.as_str().to_string(),
            },
        })
        .collect()
}

/// A schema from the API, checked (400 shape B naming `schema`).
pub fn schema_from_wire(columns: &[SchemaColumn]) -> Result<Vec<Column>, HttpError> {
    let bad = |message: String| HttpError(ApiError::bad_request(Some("schema"), message));
    let columns = columns
        .iter()
        .map(|c| {
            ColumnType::parse(&c.ty.name)
                .map(|ty| Column::new(c.name.clone(), ty))
                .ok_or_else(|| {
                    bad(format!(
                        "The column `{}` has the unknown type `{}` (use string, integer, float, \
                         boolean or json).",
                        c.name, c.ty.name
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_schema(&columns).map_err(bad)?;
    Ok(columns)
}

pub fn dataset_object(d: Dataset) -> DatasetObject {
    DatasetObject {
        id: d.id,
        object: OBJECT_DATASET.to_string(),
        name: d.name,
        folder: d.folder,
        description: d.description,
        schema: schema_to_wire(&d.schema),
        row_count: d.row_count,
        bytes: d.bytes,
        created_at: d.created_at,
        updated_at: d.updated_at,
        ai_project_id: d.project_id,
        source: d.source,
    }
}

/// Where rows being stored came from, for naming a bad one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsFrom {
    /// An upload's part (form field `data`): named by line.
    Part,
    /// `rows` of a creation request: named by index.
    Inline,
    /// The object an import reads: named by line.
    Import,
}

/// Checks the part at `input` against `schema` and writes it as Parquet to
/// `output` (on the blocking pool). A bad row is 400 shape B naming its
/// line (or index) and column.
pub async fn convert_to_parquet(
    input: PathBuf,
    format: PartFormat,
    schema: Vec<Column>,
    output: PathBuf,
    from: RowsFrom,
) -> Result<PartStats, HttpError> {
    let converted =
        tokio::task::spawn_blocking(move || table::convert_part(&input, format, &schema, &output))
            .await
            .map_err(|_| HttpError(ApiError::internal()))?;
    converted.map_err(|e| {
        let (param, message) = match e {
            PartError::Io(io) => return HttpError::from(StoreError::Io(io)),
            PartError::Row {
                line,
                column,
                message,
            } if from == RowsFrom::Inline => (
                "rows",
                match column {
                    Some(c) => format!("`rows[{}]`, column `{c}`: {message}", line - 1),
                    None => format!("`rows[{}]`: {message}", line - 1),
                },
            ),
            e if from == RowsFrom::Inline => ("rows", format!("`rows`: {e}")),
            e if from == RowsFrom::Import => ("source.url", format!("The object, {e}")),
            e => ("data", format!("Part `data`, {e}")),
        };
        HttpError(ApiError::bad_request(Some(param), message))
    })
}

/// Deletes blobs the store no longer points at; failures are logged (the
/// start-up sweep does not know dataset keys, so they would stay).
pub async fn delete_blobs(state: &AppState, keys: Vec<String>) {
    for key in keys {
        if let Err(e) = state.store.blobs().delete_key(&key).await {
            tracing::warn!(key = %key, "deleting a dataset blob: {e}");
        }
    }
}

/// The dataset `dataset_id` in any project the caller may use; else 403.
async fn caller_dataset(
    state: &AppState,
    ctx: &RequestContext,
    dataset_id: &str,
) -> Result<Dataset, HttpError> {
    let dataset = state.store.dataset_by_id(dataset_id).await?;
    ctx.check_owner(&state.store, &dataset.project_id, "dataset")
        .await?;
    Ok(dataset)
}

/// `POST /v1/datasets`: rows inline (checked like an uploaded part; the
/// schema inferred from them when absent), answered with the dataset; or
/// an import from object storage (`source`), answered with its upload
/// record (see `dataset_import`).
pub async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(mut request): ApiJson<DatasetCreateRequest>,
) -> Result<Response, HttpError> {
    request.validate()?;
    if let Some(source) = request.source.take() {
        let upload =
            super::dataset_import::start(&state, &ctx.project_id, request, &source).await?;
        return Ok(Json(upload).into_response());
    }
    let Some(rows) = request.rows else {
        return Err(HttpError(ApiError::bad_request(
            Some("rows"),
            "`rows` is missing.",
        )));
    };
    let dir = tempfile::tempdir().map_err(StoreError::from)?;
    let input = dir.path().join("rows.jsonl");
    let mut text = String::new();
    for row in &rows {
        text.push_str(&row.to_string());
        text.push('\n');
    }
    tokio::fs::write(&input, text)
        .await
        .map_err(StoreError::from)?;
    let schema = match &request.schema {
        Some(schema) => schema_from_wire(schema)?,
        None => {
            let path = input.clone();
            tokio::task::spawn_blocking(move || table::infer_schema(&path, PartFormat::Jsonl))
                .await
                .map_err(|_| HttpError(ApiError::internal()))?
                .map_err(|e| {
                    HttpError(ApiError::bad_request(
                        Some("rows"),
                        format!("Cannot infer a schema from `rows`: {e}"),
                    ))
                })?
        }
    };
    let output = dir.path().join("rows.parquet");
    let stats = convert_to_parquet(
        input,
        PartFormat::Jsonl,
        schema.clone(),
        output.clone(),
        RowsFrom::Inline,
    )
    .await?;
    let key = format!(
        "datasets/inline/{}.parquet",
        hearth_store::ids::random_hex()
    );
    let bytes = state.store.blobs().put_file(&key, &output).await?;
    let created = state
        .store
        .create_dataset(NewDataset {
            project_id: ctx.project_id.clone(),
            name: request.name,
            folder: request.folder,
            description: request.description,
            schema,
            source: Some(json!({"type": "inline"})),
            parts: vec![StoredPart {
                blob_key: key.clone(),
                rows: stats.rows as i64,
                bytes: bytes as i64,
            }],
        })
        .await;
    match created {
        Ok(dataset) => {
            tracing::info!(dataset = %dataset.id, rows = dataset.row_count, "dataset created");
            Ok(Json(dataset_object(dataset)).into_response())
        }
        Err(e) => {
            delete_blobs(&state, vec![key]).await;
            Err(e.into())
        }
    }
}

/// `GET /v1/datasets`.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(query): ApiQuery<DatasetListQuery>,
) -> Result<Json<DatasetList>, HttpError> {
    let limit = query.limit()?;
    let sort = match query.sort_by {
        DatasetSortBy::CreatedAt => DatasetSort::CreatedAt,
        DatasetSortBy::Name => DatasetSort::Name,
    };
    let descending = query.sort_order == SortOrder::Desc;
    let (datasets, has_more) = match state
        .store
        .list_datasets(&ctx.project_id, sort, descending, limit, query.after())
        .await
    {
        Ok(page) => page,
        Err(StoreError::Invalid(message)) => {
            return Err(HttpError(ApiError::bad_request(Some("after"), message)))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Json(DatasetList::new(
        datasets.into_iter().map(dataset_object).collect(),
        has_more,
    )))
}

/// `GET /v1/datasets/{dataset_id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
) -> Result<Json<DatasetObject>, HttpError> {
    Ok(Json(dataset_object(
        caller_dataset(&state, &ctx, &dataset_id).await?,
    )))
}

/// `PATCH /v1/datasets/{dataset_id}`: `name`, `folder`, `description`.
pub async fn patch(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<DatasetObject>, HttpError> {
    let dataset = caller_dataset(&state, &ctx, &dataset_id).await?;
    let request = DatasetPatchRequest::parse(&body)?;
    let patched = state
        .store
        .patch_dataset(
            &dataset.id,
            DatasetPatch {
                name: request.name,
                folder: request.folder,
                description: request.description,
            },
        )
        .await?;
    Ok(Json(dataset_object(patched)))
}

/// `DELETE /v1/datasets/{dataset_id}`: the row, then its Parquet parts.
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
) -> Result<Json<DatasetDeleted>, HttpError> {
    let dataset = caller_dataset(&state, &ctx, &dataset_id).await?;
    let keys = state.store.delete_dataset(&dataset.id).await?;
    delete_blobs(&state, keys).await;
    tracing::info!(dataset = %dataset.id, "dataset deleted");
    Ok(Json(DatasetDeleted {
        id: dataset.id,
        object: OBJECT_DATASET_DELETED.to_string(),
        deleted: true,
    }))
}

/// `GET /v1/datasets/{dataset_id}/content`.
pub async fn content(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ContentQuery>,
) -> Result<Json<DatasetContent>, HttpError> {
    let (limit, offset) = query.checked()?;
    let dataset = caller_dataset(&state, &ctx, &dataset_id).await?;
    let parts = state.store.dataset_parts(&dataset.id).await?;
    let data = table::read_rows(
        state.store.blobs(),
        &parts,
        &dataset.schema,
        offset as u64,
        limit as usize,
    )
    .await?;
    Ok(Json(DatasetContent {
        object: hearth_api::common::OBJECT_LIST.to_string(),
        data,
        offset,
        limit,
        total: dataset.row_count,
    }))
}

/// `GET /v1/datasets/{dataset_id}/export`: streamed as it is read.
pub async fn export(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ExportQuery>,
) -> Result<Response, HttpError> {
    let columns = query.columns()?;
    let dataset = caller_dataset(&state, &ctx, &dataset_id).await?;
    let columns = match columns {
        None => dataset.schema.iter().map(|c| c.name.clone()).collect(),
        Some(names) => {
            if let Some(unknown) = names
                .iter()
                .find(|n| !dataset.schema.iter().any(|c| &c.name == *n))
            {
                return Err(HttpError(ApiError::bad_request(
                    Some("columns"),
                    format!("The dataset has no column `{unknown}`."),
                )));
            }
            names
        }
    };
    let parts = state.store.dataset_parts(&dataset.id).await?;
    let (format, content_type, extension) = match query.format {
        ExportFormat::Csv => (table::ExportFormat::Csv, "text/csv; charset=utf-8", "csv"),
        ExportFormat::Jsonl => (table::ExportFormat::Jsonl, "application/jsonl", "jsonl"),
    };
    let stream = table::export(
        state.store.blobs().clone(),
        parts,
        dataset.schema,
        columns,
        format,
        query.limit,
    );
    Ok((
        [
            (CONTENT_TYPE, content_type.to_string()),
            (
                CONTENT_DISPOSITION,
                super::files::content_disposition(
                    "attachment",
                    &format!("{}.{extension}", dataset.name),
                ),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `GET /v1/datasets/{dataset_id}/query_templates`.
pub async fn query_templates(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(dataset_id): ApiPath<String>,
    headers: axum::http::HeaderMap,
) -> Result<Json<QueryTemplates>, HttpError> {
    let dataset = caller_dataset(&state, &ctx, &dataset_id).await?;
    let base = super::files::public_base(&state, &headers);
    Ok(Json(templates::for_dataset(&dataset, &base)))
}
