//! Operations of `/v1/datasets` and `/v1/datasets/uploads`.

#![allow(dead_code)]

use hearth_api::datasets::{
    ContentQuery, DatasetContent, DatasetCreateRequest, DatasetDeleted, DatasetList,
    DatasetListQuery, DatasetObject, DatasetPatchRequest, ExportQuery, QueryTemplates,
    UploadCompleteRequest, UploadCreateRequest, UploadObject, UploadPartObject,
};
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::ProjectQuery;

/// The multipart body of a part.
#[derive(utoipa::ToSchema)]
struct PartForm {
    /// The part: JSON Lines of row objects, CSV with a header row, or
    /// Parquet (from the field's content type or file name; default JSON
    /// Lines).
    #[schema(value_type = String, format = Binary)]
    data: Vec<u8>,
}

#[utoipa::path(
    post, path = "/v1/datasets", tag = "Datasets", operation_id = "createDataset",
    summary = "Create a dataset from rows sent inline, or import one from object storage",
    description = "`rows` (at most 10,000 objects) are checked against `schema` (inferred from \
        them when absent) and stored as Parquet; the answer is the dataset. With `source` \
        (`{type: \"object_storage\", url, format}`, under a prefix the server allows with \
        `--dataset-import-allow`), the answer is an upload record, `PENDING`, and the object is \
        read in the background: `GET /v1/datasets/uploads/{upload_id}` shows it `COMPLETED` \
        with the dataset's id, or `FAILED` with `error`.",
    params(ProjectQuery),
    request_body = DatasetCreateRequest,
    responses(
        (status = 200, description = "The dataset (rows inline) or the import's upload record \
            (`source`).", body = DatasetObject),
        (status = 400, description = "A bad schema, a row that breaks it (`rows[i]`), or a \
            `source` that is not allowed.", body = UpstreamError),
    )
)]
pub fn create_dataset() {}

#[utoipa::path(
    get, path = "/v1/datasets", tag = "Datasets", operation_id = "listDatasets",
    summary = "The project's datasets",
    params(DatasetListQuery),
    responses(
        (status = 200, description = "A page of datasets in the order asked for.", body = DatasetList),
        (status = 400, description = "`after` names no dataset of the project.", body = UpstreamError),
    )
)]
pub fn list_datasets() {}

#[utoipa::path(
    get, path = "/v1/datasets/{dataset_id}", tag = "Datasets", operation_id = "retrieveDataset",
    summary = "A dataset",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ProjectQuery),
    responses((status = 200, description = "The dataset.", body = DatasetObject))
)]
pub fn retrieve_dataset() {}

#[utoipa::path(
    patch, path = "/v1/datasets/{dataset_id}", tag = "Datasets", operation_id = "updateDataset",
    summary = "Rename a dataset or change its folder or description",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ProjectQuery),
    request_body = DatasetPatchRequest,
    responses(
        (status = 200, description = "The dataset.", body = DatasetObject),
        (status = 400, description = "A field other than `name`, `folder`, `description`.",
            body = UpstreamError),
    )
)]
pub fn update_dataset() {}

#[utoipa::path(
    delete, path = "/v1/datasets/{dataset_id}", tag = "Datasets", operation_id = "deleteDataset",
    summary = "Delete a dataset and its stored parts",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ProjectQuery),
    responses(
        (status = 200, description = "Deleted.", body = DatasetDeleted),
        (status = 409, description = "A fine-tuning job that has not ended uses it.", body = ErrorDetail),
    )
)]
pub fn delete_dataset() {}

#[utoipa::path(
    get, path = "/v1/datasets/{dataset_id}/content", tag = "Datasets",
    operation_id = "datasetContent", summary = "A page of rows",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ContentQuery, ProjectQuery),
    responses((status = 200, description = "Rows `offset` to `offset + limit`.", body = DatasetContent))
)]
pub fn dataset_content() {}

#[utoipa::path(
    get, path = "/v1/datasets/{dataset_id}/export", tag = "Datasets",
    operation_id = "exportDataset", summary = "The rows as CSV or JSON Lines, streamed",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ExportQuery, ProjectQuery),
    responses(
        (status = 200, description = "CSV (`text/csv`, a header row) or JSON Lines \
            (`application/jsonl`).", content_type = "text/csv", body = String),
        (status = 400, description = "An unknown or repeated column.", body = UpstreamError),
    )
)]
pub fn export_dataset() {}

#[utoipa::path(
    get, path = "/v1/datasets/{dataset_id}/query_templates", tag = "Datasets",
    operation_id = "datasetQueryTemplates", summary = "Ready-made queries over a dataset",
    params(("dataset_id" = String, Path, description = "The dataset's id."), ProjectQuery),
    responses((status = 200, description = "The templates.", body = QueryTemplates))
)]
pub fn query_templates() {}

#[utoipa::path(
    post, path = "/v1/datasets/uploads", tag = "Datasets", operation_id = "createDatasetUpload",
    summary = "Start a multipart dataset upload",
    params(ProjectQuery),
    request_body = UploadCreateRequest,
    responses(
        (status = 200, description = "The upload, `PENDING`.", body = UploadObject),
        (status = 400, description = "A bad name or schema.", body = UpstreamError),
    )
)]
pub fn create_upload() {}

#[utoipa::path(
    get, path = "/v1/datasets/uploads/{upload_id}", tag = "Datasets",
    operation_id = "retrieveDatasetUpload", summary = "An upload (or import) and how it went",
    params(("upload_id" = String, Path, description = "The upload's id."), ProjectQuery),
    responses((status = 200, description = "The upload record.", body = UploadObject))
)]
pub fn retrieve_upload() {}

#[utoipa::path(
    post, path = "/v1/datasets/uploads/{upload_id}/parts", tag = "Datasets",
    operation_id = "addDatasetUploadPart", summary = "Send one part of an upload",
    description = "Every row is checked against the upload's schema before the part is \
        stored (as Parquet).",
    params(("upload_id" = String, Path, description = "The upload's id."), ProjectQuery),
    request_body(content = PartForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The part.", body = UploadPartObject),
        (status = 400, description = "A row that breaks the schema (its line and column), or \
            no `data` field.", body = UpstreamError),
        (status = 409, description = "The upload is completed or cancelled.", body = ErrorDetail),
        (status = 413, description = "The part is over the upload limit.", body = ErrorDetail),
    )
)]
pub fn add_part() {}

#[utoipa::path(
    post, path = "/v1/datasets/uploads/{upload_id}/complete", tag = "Datasets",
    operation_id = "completeDatasetUpload", summary = "Make the dataset from parts, in order",
    params(("upload_id" = String, Path, description = "The upload's id."), ProjectQuery),
    request_body = UploadCompleteRequest,
    responses(
        (status = 200, description = "The upload, `COMPLETED`, with its dataset's id (the same \
            again for the same list).", body = UploadObject),
        (status = 400, description = "A part id not of this upload, repeated, or none.",
            body = UpstreamError),
        (status = 409, description = "Cancelled, or completed with other parts.", body = ErrorDetail),
    )
)]
pub fn complete_upload() {}

#[utoipa::path(
    post, path = "/v1/datasets/uploads/{upload_id}/cancel", tag = "Datasets",
    operation_id = "cancelDatasetUpload", summary = "Cancel an upload and drop its parts",
    params(("upload_id" = String, Path, description = "The upload's id."), ProjectQuery),
    responses(
        (status = 200, description = "The upload, `CANCELLED`.", body = UploadObject),
        (status = 409, description = "Already completed.", body = ErrorDetail),
    )
)]
pub fn cancel_upload() {}
