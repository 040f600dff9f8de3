//! `/v1/fine_tuning`: create, list, retrieve and cancel jobs; their events
//! and checkpoints; the spec-draft list of trainable models.
//!
//! Creation checks everything knowable before a job exists (the model, the
//! hyperparameters, the files: project, purpose, status, every line), so a
//! job never fails later for a reason the request already showed. The job
//! is stored `queued`; a worker (hearth-jobs) claims it from the store.
//! Lists and creation work in the caller's project; by-id routes find the
//! job in any project the caller may use (only the named one when
//! `ai_project_id` is given). Another account's job, or a missing one, is
//! 403 shape A (as files).

use axum::extract::State;
use axum::{Extension, Json};
use futures_util::TryStreamExt;
use hearth_api::fine_tuning::{
    self as ft, FineTuneRequest, FineTuningCheckpoint, FineTuningEvent, FineTuningJob,
    FineTuningList, FineTuningListQuery, JobMethod, SupervisedMethod, TrainableModel,
    TrainableModelList, TrainablePricing, DEFAULT_CHECKPOINT_LIMIT, DEFAULT_LIST_LIMIT,
    OBJECT_CHECKPOINT, OBJECT_EVENT, OBJECT_JOB, PURPOSE_FINE_TUNE,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_engine::catalog::WeightFormat;
use hearth_engine::ChatModel;
use hearth_store::{FtCheckpoint, FtEvent, FtJob, NewFtJob, StoreError};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;

/// The job as the API shows it.
pub fn job_object(job: FtJob) -> FineTuningJob {
    let hyperparameters = ft::with_multiplier(job.hyperparameters);
    FineTuningJob {
        id: job.id,
        object: OBJECT_JOB.to_string(),
        model: job.model,
        created_at: job.created_at,
        finished_at: job.finished_at,
        status: job.status.as_str().to_string(),
        fine_tuned_model: job.fine_tuned_model,
        organization_id: job.project_id,
        training_file: job.training_file,
        validation_file: job.validation_file,
        method: JobMethod {
            kind: job.method,
            supervised: SupervisedMethod {
                hyperparameters: hyperparameters.clone(),
            },
        },
        hyperparameters,
        seed: job.seed,
        trained_tokens: job.trained_tokens,
        trained_steps: job.trained_steps,
        total_steps: job.total_steps,
        result_files: job.result_files,
        error: job.error,
        suffix: job.suffix,
        estimated_finish: None,
        integrations: Vec::new(),
        metadata: job.metadata,
    }
}

fn event_object(e: FtEvent) -> FineTuningEvent {
    FineTuningEvent {
        id: e.id,
        object: OBJECT_EVENT.to_string(),
        created_at: e.created_at,
        level: e.level,
        kind: e.kind,
        message: e.message,
        data: e.data,
    }
}

fn checkpoint_object(c: FtCheckpoint) -> FineTuningCheckpoint {
    FineTuningCheckpoint {
        id: c.id,
        object: OBJECT_CHECKPOINT.to_string(),
        created_at: c.created_at,
        fine_tuning_job_id: c.job_id,
        step_number: c.step_number,
        fine_tuned_model_checkpoint: c.fine_tuned_model_checkpoint,
        metrics: c.metrics,
        result_files: c.result_files,
    }
}

/// The served chat model `id`, when it can be fine-tuned (LoRA over GGUF,
/// quantized formats included, or safetensors weights).
fn trainable<'a>(state: &'a AppState, id: &str) -> Option<&'a ChatModel> {
    state.chat.get(id).filter(|m| {
        matches!(
            m.entry.format,
            WeightFormat::Gguf | WeightFormat::Safetensors
        )
    })
}

/// A random seed for a request that names none (stored with the job).
fn random_seed() -> i64 {
    use rand::Rng;
    rand::rng().random_range(0..=i64::from(i32::MAX))
}

/// Checks a training or validation file: the caller's, purpose
/// `fine-tune`, not marked `error`, and every line a training example.
/// Each failure is 400 shape B naming `param`.
async fn check_file(
    state: &AppState,
    project_id: &str,
    file_id: &str,
    param: &str,
) -> Result<(), HttpError> {
    if hearth_store::datasets::names_dataset(file_id) {
        return check_dataset(state, project_id, file_id, param).await;
    }
    let file = match state.store.file(project_id, file_id).await {
        Ok(file) => file,
        Err(StoreError::NotFound(_)) => {
            return Err(HttpError(ApiError::bad_request(
                Some(param),
                format!("The file `{file_id}` does not exist in this project."),
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if file.purpose != PURPOSE_FINE_TUNE {
        return Err(HttpError(ApiError::bad_request(
            Some(param),
            format!(
                "The file `{file_id}` has purpose `{}`; fine-tuning needs purpose `{PURPOSE_FINE_TUNE}`.",
                file.purpose
            ),
        )));
    }
    if file.status == hearth_store::FileStatus::Error.as_str() {
        return Err(HttpError(ApiError::bad_request(
            Some(param),
            format!(
                "The file `{file_id}` is not valid JSONL: {}",
                file.status_details
                    .as_deref()
                    .unwrap_or("it failed its check")
            ),
        )));
    }
    // Checked line by line as the content streams by (never held whole),
    // with at most `--max-validations` checks at once.
    let _permit = state
        .limits
        .validations
        .acquire()
        .await
        .map_err(|_| HttpError(ApiError::internal()))?;
    let content = state.store.file_content(&file).await?;
    check_lines(content, &format!("The file `{file_id}`"), param).await
}

/// A dataset named as a training or validation file: the project's, with
/// `messages` or `prompt`/`completion` columns, every row an example.
async fn check_dataset(
    state: &AppState,
    project_id: &str,
    dataset_id: &str,
    param: &str,
) -> Result<(), HttpError> {
    let bad = |message: String| HttpError(ApiError::bad_request(Some(param), message));
    let dataset = match state.store.dataset_by_id(dataset_id).await {
        Ok(d) if d.project_id == project_id => d,
        Ok(_) | Err(StoreError::NotFound(_)) => {
            return Err(bad(format!(
                "The dataset `{dataset_id}` does not exist in this project."
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let lines = match state.store.dataset_training_lines(&dataset).await {
        Ok(lines) => lines,
        Err(StoreError::Invalid(message)) => return Err(bad(message)),
        Err(e) => return Err(e.into()),
    };
    let _permit = state
        .limits
        .validations
        .acquire()
        .await
        .map_err(|_| HttpError(ApiError::internal()))?;
    check_lines(lines, &format!("The dataset `{dataset_id}`"), param).await
}

/// Runs every line of `content` through the training-line check (on the
/// blocking pool, a chunk at a time); 400 naming `what` and the line.
async fn check_lines(
    mut content: futures_util::stream::BoxStream<'static, Result<bytes::Bytes, StoreError>>,
    what: &str,
    param: &str,
) -> Result<(), HttpError> {
    let mut lines = LineChecker::default();
    while let Some(chunk) = content.try_next().await.map_err(HttpError::from)? {
        let mut checker = std::mem::take(&mut lines);
        checker = tokio::task::spawn_blocking(move || {
            checker.feed(&chunk);
            checker
        })
        .await
        .map_err(|_| HttpError(ApiError::internal()))?;
        lines = checker;
        if lines.problem.is_some() {
            break;
        }
    }
    lines.finish().map_err(|problem| {
        HttpError(ApiError::bad_request(
            Some(param),
            format!("{what} is not a valid fine-tuning dataset: {problem}"),
        ))
    })
}

/// Checks a training file's lines as its chunks arrive: each non-blank
/// line must be a training example. Holds only the current line.
#[derive(Default)]
struct LineChecker {
    line: Vec<u8>,
    /// Lines seen so far.
    number: usize,
    examples: usize,
    problem: Option<String>,
}

impl LineChecker {
    fn feed(&mut self, mut chunk: &[u8]) {
        while self.problem.is_none() && !chunk.is_empty() {
            match chunk.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.line.extend_from_slice(&chunk[..end]);
                    self.end_line();
                    chunk = &chunk[end + 1..];
                }
                None => {
                    self.line.extend_from_slice(chunk);
                    chunk = &[];
                }
            }
        }
    }

    fn end_line(&mut self) {
        self.number += 1;
        let line = std::mem::take(&mut self.line);
        let bytes = match self.number {
            1 => hearth_store::jsonl::without_bom(&line),
            _ => &line,
        };
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => {
                self.problem = Some(format!("line {}: not UTF-8", self.number));
                return;
            }
        };
        if text.trim().is_empty() {
            return;
        }
        match hearth_api::training_data::parse_training_line(text) {
            Ok(_) => self.examples += 1,
            Err(e) => self.problem = Some(format!("line {}: {e}", self.number)),
        }
    }

    fn finish(mut self) -> Result<(), String> {
        if self.problem.is_none() && !self.line.is_empty() {
            self.end_line();
        }
        match self.problem {
            Some(problem) => Err(problem),
            None if self.examples == 0 => Err("the file holds no examples".into()),
            None => Ok(()),
        }
    }
}

/// `POST /v1/fine_tuning/jobs`.
pub async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    ApiJson(request): ApiJson<FineTuneRequest>,
) -> Result<Json<FineTuningJob>, HttpError> {
    state.usage.check_budget(&ctx.project_id)?;
    let Some(model) = trainable(&state, &request.model) else {
        return Err(HttpError(ApiError::bad_request(
            Some("model"),
            format!(
                "The model `{}` does not exist or cannot be fine-tuned; \
                 see GET /v1/fine_tuning/models/spec-draft.",
                request.model
            ),
        )));
    };
    let context_length = u32::try_from(model.engine.context_length()).unwrap_or(u32::MAX);
    let valid = ft::resolve(&request, context_length, random_seed())?;
    check_file(
        &state,
        &ctx.project_id,
        &valid.training_file,
        "training_file",
    )
    .await?;
    if let Some(validation_file) = &valid.validation_file {
        check_file(&state, &ctx.project_id, validation_file, "validation_file").await?;
    }
    let hyperparameters = serde_json::to_value(&valid.hyperparameters)
        .map_err(|_| HttpError(ApiError::internal()))?;
    let job = state
        .store
        .create_ft_job(NewFtJob {
            project_id: ctx.project_id.clone(),
            model: valid.model,
            training_file: valid.training_file,
            validation_file: valid.validation_file,
            suffix: valid.suffix,
            seed: valid.seed,
            hyperparameters,
            method: valid.method,
            metadata: valid.metadata.map(|m| serde_json::json!(m)),
        })
        .await?;
    tracing::info!(job = %job.id, model = %job.model, "fine-tuning job created");
    Ok(Json(job_object(job)))
}

/// `GET /v1/fine_tuning/jobs`: newest first; with `metadata[<key>]=<value>`
/// pairs, only the jobs whose metadata holds all of them.
pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    uri: axum::http::Uri,
    ApiQuery(query): ApiQuery<FineTuningListQuery>,
) -> Result<Json<FineTuningList<FineTuningJob>>, HttpError> {
    let limit = query.limit(DEFAULT_LIST_LIMIT)?;
    let metadata = ft::metadata_filter(uri.query())?;
    let (jobs, has_more) = state
        .store
        .list_ft_jobs_with_metadata(&ctx.project_id, limit, query.after(), &metadata)
        .await?;
    Ok(Json(FineTuningList::new(
        jobs.into_iter().map(job_object).collect(),
        has_more,
    )))
}

/// The job `job_id` in any project the caller may use (the named one when
/// `ai_project_id` is given); else 403, as for a missing job.
async fn caller_job(
    state: &AppState,
    ctx: &RequestContext,
    job_id: &str,
) -> Result<FtJob, HttpError> {
    let job = state.store.ft_job_by_id(job_id).await?;
    ctx.check_owner(&state.store, &job.project_id, "fine-tuning job")
        .await?;
    Ok(job)
}

/// `GET /v1/fine_tuning/jobs/{job_id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(job_id): ApiPath<String>,
) -> Result<Json<FineTuningJob>, HttpError> {
    let job = caller_job(&state, &ctx, &job_id).await?;
    Ok(Json(job_object(job)))
}

/// `POST /v1/fine_tuning/jobs/{job_id}/cancel`: immediate; the job comes
/// back `cancelled` (a cancelled job as it is). A job already succeeded or
/// failed: 400 shape B.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(job_id): ApiPath<String>,
) -> Result<Json<FineTuningJob>, HttpError> {
    let job = caller_job(&state, &ctx, &job_id).await?;
    match state.store.cancel_ft_job(&job.project_id, &job.id).await {
        Ok(job) => {
            tracing::info!(job = %job.id, "fine-tuning job cancelled");
            Ok(Json(job_object(job)))
        }
        Err(StoreError::Invalid(message)) => Err(HttpError(ApiError::bad_request(None, message))),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/fine_tuning/jobs/{job_id}/events`: newest first.
pub async fn events(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(job_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<FineTuningListQuery>,
) -> Result<Json<FineTuningList<FineTuningEvent>>, HttpError> {
    let limit = query.limit(DEFAULT_LIST_LIMIT)?;
    let job = caller_job(&state, &ctx, &job_id).await?;
    let (events, has_more) = state
        .store
        .list_ft_events(&job.id, limit, query.after())
        .await?;
    Ok(Json(FineTuningList::new(
        events.into_iter().map(event_object).collect(),
        has_more,
    )))
}

/// `GET /v1/fine_tuning/jobs/{job_id}/checkpoints`: newest first.
pub async fn checkpoints(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(job_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<FineTuningListQuery>,
) -> Result<Json<FineTuningList<FineTuningCheckpoint>>, HttpError> {
    let limit = query.limit(DEFAULT_CHECKPOINT_LIMIT)?;
    let job = caller_job(&state, &ctx, &job_id).await?;
    let (checkpoints, has_more) = state
        .store
        .list_ft_checkpoints(&job.id, limit, query.after())
        .await?;
    Ok(Json(FineTuningList::new(
        checkpoints.into_iter().map(checkpoint_object).collect(),
        has_more,
    )))
}

/// `GET /v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}`.
pub async fn checkpoint(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath((job_id, checkpoint_id)): ApiPath<(String, String)>,
) -> Result<Json<FineTuningCheckpoint>, HttpError> {
    let job = caller_job(&state, &ctx, &job_id).await?;
    let checkpoint = state.store.ft_checkpoint(&job.id, &checkpoint_id).await?;
    Ok(Json(checkpoint_object(checkpoint)))
}

/// `GET /v1/fine_tuning/models/spec-draft` (and without `/v1`): the chat
/// models this server serves that can be fine-tuned, each with its price
/// bucket (by the parameter count its id or description states: see
/// [`ft::price_bucket`]), its catalogue prices and its hyperparameters'
/// defaults and ranges.
pub async fn spec_draft(State(state): State<AppState>) -> Json<TrainableModelList> {
    let data = state
        .chat
        .keys()
        .filter_map(|id| trainable(&state, id))
        .map(|m| {
            let e = &m.entry;
            let parameters = ft::parameter_count(&e.id)
                .or_else(|| e.description.as_deref().and_then(ft::parameter_count));
            TrainableModel::new(
                e.id.clone(),
                e.owner(),
                u32::try_from(m.engine.context_length()).unwrap_or(u32::MAX),
                ft::price_bucket(parameters),
                TrainablePricing {
                    input_per_million: e.price_input_per_million,
                    output_per_million: e.price_output_per_million,
                },
            )
        })
        .collect();
    Json(TrainableModelList::new(data))
}
