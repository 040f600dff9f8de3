//! Operations of `/v1/files`, including the signed download (no key).

#![allow(dead_code)]

use hearth_api::schemas::{ErrorDetail, FileUploadForm, UpstreamError, ValidationError};
use hearth_api::{
    FileDeleted, FileLink, FileList, FileObject, FilesQuery, LinkQuery, ProjectQuery,
};

use super::Binary;

#[utoipa::path(
    post,
    path = "/v1/files",
    tag = "Files",
    operation_id = "uploadFile",
    summary = "Upload a file",
    description = "Streams the `file` field to the blob store. `fine-tune` and `batch` files \
        are checked line by line: a line that is not a JSON object gives `status: \"error\"`. \
        An empty `file` part without a file name (a form's file input with nothing chosen) \
        counts as missing (422).",
    params(ProjectQuery),
    request_body(content = FileUploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The stored file.", body = FileObject),
        (status = 400, description = "More than one `file` field, or the upload was interrupted.",
            body = ErrorDetail),
        (status = 413, description = "The file is over `--max-upload-mb`.", body = ErrorDetail),
    )
)]
pub fn upload_file() {}

#[utoipa::path(
    get,
    path = "/v1/files",
    tag = "Files",
    operation_id = "listFiles",
    summary = "The project's files",
    params(FilesQuery),
    responses(
        (status = 200, description = "A page of files.", body = FileList),
    )
)]
pub fn list_files() {}

#[utoipa::path(
    get,
    path = "/v1/files/{file_id}",
    tag = "Files",
    operation_id = "retrieveFile",
    summary = "A file",
    params(
        ("file_id" = String, Path, description = "The file's id.", pattern = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The file.", body = FileObject),
    )
)]
pub fn retrieve_file() {}

#[utoipa::path(
    delete,
    path = "/v1/files/{file_id}",
    tag = "Files",
    operation_id = "deleteFile",
    summary = "Delete a file",
    params(
        ("file_id" = String, Path, description = "The file's id.", pattern = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The file is gone.", body = FileDeleted),
        (status = 409, description = "A queued or running fine-tuning job uses the file.",
            body = ErrorDetail),
    )
)]
pub fn delete_file() {}

#[utoipa::path(
    get,
    path = "/v1/files/{file_id}/content",
    tag = "Files",
    operation_id = "downloadFileContent",
    summary = "A file's bytes, as uploaded",
    params(
        ("file_id" = String, Path, description = "The file's id.", pattern = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The content (`Content-Disposition: attachment`).",
            content((Binary = "application/octet-stream"))),
    )
)]
pub fn file_content() {}

#[utoipa::path(
    get,
    path = "/v1/files/{file_id}/link",
    tag = "Files",
    operation_id = "createFileLink",
    summary = "A signed URL that downloads the file without a key",
    params(
        ("file_id" = String, Path, description = "The file's id.", pattern = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"),
        LinkQuery,
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The link and when it expires.", body = FileLink),
        (status = 400, description = "`expires_in` out of range.", body = UpstreamError),
    )
)]
pub fn file_link() {}

#[utoipa::path(
    get,
    path = "/v1/files/{file_id}/download",
    tag = "Files",
    operation_id = "downloadFileByLink",
    summary = "Download through a signed link (no key)",
    description = "The URL `GET /v1/files/{file_id}/link` gives. An expired, altered or \
        incomplete link, or one to a deleted file, is 403.",
    security(()),
    params(
        ("file_id" = String, Path, description = "The file's id.", pattern = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"),
        ("expires_at" = i64, Query, description = "When the link expires (seconds since the epoch)."),
        ("signature" = String, Query, description = "The link's HMAC-SHA256, hex."),
    ),
    responses(
        (status = 200, description = "The content (`Content-Disposition: attachment`).",
            content((Binary = "application/octet-stream"))),
        (status = 403, description = "The link is invalid or has expired.", body = ErrorDetail),
        (status = 422, description = "The file id in the path is not valid text.",
            body = ValidationError),
    )
)]
pub fn download_file() {}
