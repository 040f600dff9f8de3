//! Operations of `/v1/fine_tuning` and the unversioned spec-draft list.

#![allow(dead_code)]

use hearth_api::fine_tuning::FineTuneRequest;
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::{
    FineTuningCheckpoint, FineTuningEvent, FineTuningJob, FineTuningList, FineTuningListQuery,
    ProjectQuery, TrainableModelList,
};

#[utoipa::path(
    post,
    path = "/v1/fine_tuning/jobs",
    tag = "Fine-tuning",
    operation_id = "createFineTuningJob",
    summary = "Queue a LoRA fine-tuning job",
    description = "Checks the model, the hyperparameters and every line of the files before \
        the job exists; the job is stored `queued`.",
    params(ProjectQuery),
    request_body = FineTuneRequest,
    responses(
        (status = 200, description = "The queued job.", body = FineTuningJob),
        (status = 400, description = "A model that cannot be fine-tuned, a hyperparameter out \
            of range (`param`: `hyperparameters.<name>`), a bad `suffix`, or a training or \
            validation file that is missing, of another purpose or not a dataset.",
            body = UpstreamError),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
    )
)]
pub fn create_job() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/jobs",
    tag = "Fine-tuning",
    operation_id = "listFineTuningJobs",
    summary = "The project's jobs, newest first",
    params(
        FineTuningListQuery,
        ("metadata" = Option<std::collections::BTreeMap<String, String>>, Query,
            style = DeepObject, explode,
            description = "Only jobs whose `metadata` holds every pair given, as \
                `metadata[key]=value` (several pairs: all must match)."),
    ),
    responses(
        (status = 200, description = "A page of jobs.", body = FineTuningList<FineTuningJob>),
    )
)]
pub fn list_jobs() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/jobs/{job_id}",
    tag = "Fine-tuning",
    operation_id = "retrieveFineTuningJob",
    summary = "A job",
    params(
        ("job_id" = String, Path, description = "The job's id.", pattern = r"^ftjob-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The job.", body = FineTuningJob),
    )
)]
pub fn retrieve_job() {}

#[utoipa::path(
    post,
    path = "/v1/fine_tuning/jobs/{job_id}/cancel",
    tag = "Fine-tuning",
    operation_id = "cancelFineTuningJob",
    summary = "Cancel a job at once",
    params(
        ("job_id" = String, Path, description = "The job's id.", pattern = r"^ftjob-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The job, `cancelled` (a cancelled job as it was).",
            body = FineTuningJob),
        (status = 400, description = "The job already succeeded or failed.", body = UpstreamError),
    )
)]
pub fn cancel_job() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/jobs/{job_id}/events",
    tag = "Fine-tuning",
    operation_id = "listFineTuningEvents",
    summary = "A job's events, newest first",
    params(
        ("job_id" = String, Path, description = "The job's id.", pattern = r"^ftjob-[0-9A-HJKMNP-TV-Z]{26}$"),
        FineTuningListQuery,
    ),
    responses(
        (status = 200, description = "A page of events.", body = FineTuningList<FineTuningEvent>),
    )
)]
pub fn list_events() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/jobs/{job_id}/checkpoints",
    tag = "Fine-tuning",
    operation_id = "listFineTuningCheckpoints",
    summary = "A job's checkpoints, newest first",
    params(
        ("job_id" = String, Path, description = "The job's id.", pattern = r"^ftjob-[0-9A-HJKMNP-TV-Z]{26}$"),
        FineTuningListQuery,
    ),
    responses(
        (status = 200, description = "A page of checkpoints.",
            body = FineTuningList<FineTuningCheckpoint>),
    )
)]
pub fn list_checkpoints() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}",
    tag = "Fine-tuning",
    operation_id = "retrieveFineTuningCheckpoint",
    summary = "A checkpoint of a job",
    params(
        ("job_id" = String, Path, description = "The job's id.", pattern = r"^ftjob-[0-9A-HJKMNP-TV-Z]{26}$"),
        ("checkpoint_id" = String, Path, description = "The checkpoint's id.",
            pattern = r"^ftckpt-[0-9A-HJKMNP-TV-Z]{26}$"),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "The checkpoint.", body = FineTuningCheckpoint),
    )
)]
pub fn retrieve_checkpoint() {}

#[utoipa::path(
    get,
    path = "/v1/fine_tuning/models/spec-draft",
    tag = "Fine-tuning",
    operation_id = "listTrainableModels",
    summary = "The models that can be fine-tuned",
    description = "Each with its catalogue prices, a billing `price_bucket` and every \
        hyperparameter's type, default and range.",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The trainable models.", body = TrainableModelList),
    )
)]
pub fn spec_draft() {}

#[utoipa::path(
    get,
    path = "/fine_tuning/models/spec-draft",
    tag = "Fine-tuning",
    operation_id = "listTrainableModelsUnversioned",
    summary = "The models that can be fine-tuned (without the version prefix)",
    params(ProjectQuery),
    responses(
        (status = 200, description = "The trainable models.", body = TrainableModelList),
    )
)]
pub fn spec_draft_unversioned() {}
