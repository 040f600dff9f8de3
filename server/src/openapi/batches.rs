//! Operations of `/v1/batches`.

#![allow(dead_code)]

use hearth_api::batches::{BatchCreateRequest, BatchList, BatchListQuery, BatchObject};
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::ProjectQuery;

#[utoipa::path(
    post,
    path = "/v1/batches",
    tag = "Batches",
    operation_id = "createBatch",
    summary = "Run a file of requests as a batch",
    description = "The input file (purpose `batch`) holds one request per line: \
        `{custom_id, method: \"POST\", url, body}` with `url` the batch's `endpoint`. The batch \
        is stored `validating`; the worker checks every line (a bad one fails the batch with its \
        line number in `errors`), then runs them at the engine's batch priority and writes an \
        output file and an error file (purpose `batch_output`).",
    params(ProjectQuery),
    request_body = BatchCreateRequest,
    responses(
        (status = 200, description = "The batch, `validating`.", body = BatchObject),
        (status = 400, description = "An endpoint batches cannot run, a completion window other \
            than `24h`, metadata over its limits, an override out of range, or an input file \
            that is missing, of another purpose or not JSONL.", body = UpstreamError),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
    )
)]
pub fn create_batch() {}

#[utoipa::path(
    get,
    path = "/v1/batches",
    tag = "Batches",
    operation_id = "listBatches",
    summary = "The project's batches, newest first",
    params(BatchListQuery),
    responses(
        (status = 200, description = "A page of batches.", body = BatchList),
    )
)]
pub fn list_batches() {}

#[utoipa::path(
    get,
    path = "/v1/batches/{batch_id}",
    tag = "Batches",
    operation_id = "retrieveBatch",
    summary = "A batch",
    params(
        ("batch_id" = String, Path, description = "The batch's id.", pattern = r"^batch-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The batch.", body = BatchObject),
    )
)]
pub fn retrieve_batch() {}

#[utoipa::path(
    post,
    path = "/v1/batches/{batch_id}/cancel",
    tag = "Batches",
    operation_id = "cancelBatch",
    summary = "Cancel a batch",
    description = "A running batch becomes `cancelling`: its requests in flight are dropped, \
        the results so far are written, and it ends `cancelled`. A batch no worker holds yet is \
        `cancelled` at once.",
    params(
        ("batch_id" = String, Path, description = "The batch's id.", pattern = r"^batch-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The batch, `cancelling` or `cancelled`.", body = BatchObject),
        (status = 400, description = "The batch is already over (or finalizing).",
            body = UpstreamError),
    )
)]
pub fn cancel_batch() {}
