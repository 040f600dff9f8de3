//! One claimed batch, from its input file to its result files.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use hearth_api::batches::{
    BatchError, BatchInputLine, BatchLineError, BatchOutputLine, BatchResponse,
    PURPOSE_BATCH_OUTPUT,
};
use hearth_store::{Batch, BatchResult, BatchStatus, Store};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use super::{BatchCounters, BatchEndpoints, BatchWorkerConfig, BoxFuture, EndpointReply};

mod check;

/// Results read back per page when the result files are written.
const RESULT_PAGE: i64 = 1000;

/// What the heartbeat tells the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Run,
    /// Cancelled by its owner.
    Cancel,
    /// The completion window passed.
    Expire,
    /// No longer this worker's (taken over, or gone): write nothing more.
    Lost,
}

pub(super) struct BatchRun {
    pub store: Store,
    pub endpoints: Arc<dyn BatchEndpoints>,
    pub config: BatchWorkerConfig,
    pub inflight: Arc<Semaphore>,
    pub counters: Arc<BatchCounters>,
}

/// An input line that passed its checks, with its line number (from 1).
#[derive(Debug)]
struct Request {
    line: i64,
    input: BatchInputLine,
}

/// Why a batch could not go on.
enum Stop {
    Control(Control),
    Failed(Vec<BatchError>),
    Store(hearth_store::StoreError),
}

impl From<hearth_store::StoreError> for Stop {
    fn from(e: hearth_store::StoreError) -> Self {
        Stop::Store(e)
    }
}

fn batch_error(code: &str, message: String, line: Option<i64>) -> BatchError {
    BatchError {
        code: code.to_string(),
        message,
        param: None,
        line: line.map(|l| l.max(0) as u64),
    }
}

impl BatchRun {
    pub async fn run(self, batch: Batch) {
        let (tx, control) = watch::channel(Control::Run);
        let heartbeat = tokio::spawn(heartbeat(
            self.store.clone(),
            batch.clone(),
            self.config.clone(),
            tx,
        ));
        let id = batch.id.clone();
        let outcome = self.drive(batch, control).await;
        heartbeat.abort();
        match outcome {
            Ok(status) => tracing::info!(batch = %id, %status, "batch ended"),
            Err(Stop::Control(Control::Lost)) => {
                tracing::warn!(batch = %id, "batch no longer held by this worker; stopped")
            }
            Err(Stop::Store(e)) => {
                // Left claimed: its heartbeat stops, and a worker takes it
                // over (or this one after a restart) and resumes it.
                tracing::error!(batch = %id, error = %e, "batch stopped on a storage error")
            }
            Err(_) => {}
        }
    }

    async fn drive(
        &self,
        batch: Batch,
        control: watch::Receiver<Control>,
    ) -> Result<BatchStatus, Stop> {
        let worker = self.config.worker_id.as_str();
        if batch.status == BatchStatus::Cancelling && batch.in_progress_at.is_none() {
            return self.end(&batch, BatchStatus::Cancelled, Vec::new()).await;
        }
        let check::Parsed { requests, problems } = match self.read_requests(&batch).await {
            Ok(parsed) => parsed,
            Err(Stop::Failed(errors)) => return self.fail(&batch, errors).await,
            Err(stop) => return Err(stop),
        };
        if batch.status != BatchStatus::Validating && !problems.is_empty() {
            return self.fail(&batch, check::report(problems)).await;
        }
        if batch.status == BatchStatus::Validating {
            let checked = self
                .check_requests(&batch, &requests, problems, &control)
                .await;
            let model = match checked {
                Ok(model) => model,
                Err(Stop::Failed(errors)) => return self.fail(&batch, errors).await,
                Err(Stop::Control(Control::Cancel)) => {
                    return self.end(&batch, BatchStatus::Cancelled, Vec::new()).await
                }
                Err(stop) => return Err(stop),
            };
            let total = requests.len() as i64;
            if !self
                .store
                .start_batch(&batch.id, worker, &model, total)
                .await?
            {
                return self.after_lost_write(&batch).await;
            }
            tracing::info!(batch = %batch.id, %model, total, "batch validated; running");
        }
        let status = match batch.status {
            BatchStatus::Finalizing => Control::Run,
            BatchStatus::Cancelling => Control::Cancel,
            _ => self.execute(&batch, &requests, control).await?,
        };
        match status {
            Control::Run => {
                // in_progress -> finalizing (already so when resumed there).
                // It does not apply when a cancel came after the last
                // result, before the heartbeat saw it: the batch ends
                // `cancelled` with every result (or it is no longer ours).
                if !self.store.finalize_batch(&batch.id, worker).await? {
                    return self.after_lost_write(&batch).await;
                }
                self.end(&batch, BatchStatus::Completed, Vec::new()).await
            }
            Control::Cancel => self.end(&batch, BatchStatus::Cancelled, Vec::new()).await,
            Control::Expire => {
                let done = self.done_lines(&batch).await?;
                let expired = requests
                    .iter()
                    .filter(|r| !done.contains(&r.line))
                    .map(|r| {
                        failure_line(
                            &r.input.custom_id,
                            None,
                            "batch_expired",
                            "This request could not be executed before the completion window \
                             expired."
                                .into(),
                        )
                    })
                    .collect();
                // A cancel that landed after the heartbeat saw the window
                // pass wins: the batch ends `cancelled` with its results.
                match self.end(&batch, BatchStatus::Expired, expired).await {
                    Err(Stop::Control(Control::Lost)) => self.after_lost_write(&batch).await,
                    ended => ended,
                }
            }
            Control::Lost => Err(Stop::Control(Control::Lost)),
        }
    }

    /// A transition that did not apply: the batch changed under us (a
    /// cancel during validation, after the last result or after the
    /// window passed), or it is no longer ours.
    async fn after_lost_write(&self, batch: &Batch) -> Result<BatchStatus, Stop> {
        let now = self.store.batch_by_id(&batch.id).await?;
        if now.status == BatchStatus::Cancelling
            && now.claimed_by.as_deref() == Some(self.config.worker_id.as_str())
        {
            return self.end(&now, BatchStatus::Cancelled, Vec::new()).await;
        }
        Err(Stop::Control(Control::Lost))
    }

    async fn fail(&self, batch: &Batch, errors: Vec<BatchError>) -> Result<BatchStatus, Stop> {
        let errors = serde_json::to_value(&errors).unwrap_or(Value::Null);
        tracing::info!(batch = %batch.id, %errors, "batch failed validation");
        if self
            .store
            .fail_batch(&batch.id, &self.config.worker_id, errors)
            .await?
        {
            Ok(BatchStatus::Failed)
        } else {
            self.after_lost_write(batch).await
        }
    }

    /// Runs the lines without a result, at most `max_inflight` at once on
    /// the node, until all are done or the heartbeat says to stop (the
    /// requests in flight are then dropped). Returns why it ended.
    async fn execute(
        &self,
        batch: &Batch,
        requests: &[Request],
        mut control: watch::Receiver<Control>,
    ) -> Result<Control, Stop> {
        let worker = self.config.worker_id.as_str();
        let done = self.done_lines(batch).await?;
        // Indices of the requests still to run (a plain queue: nothing
        // borrowed from a closure lives across the awaits below).
        let mut pending: std::collections::VecDeque<usize> = (0..requests.len())
            .filter(|&i| !done.contains(&requests[i].line))
            .collect();
        if !done.is_empty() {
            tracing::info!(batch = %batch.id, done = done.len(), "batch resumed");
        }
        let mut running: FuturesUnordered<BoxFuture<(i64, String, EndpointReply)>> =
            FuturesUnordered::new();
        loop {
            let now = *control.borrow_and_update();
            if now != Control::Run {
                return Ok(now);
            }
            if running.is_empty() && pending.is_empty() {
                return Ok(Control::Run);
            }
            tokio::select! {
                biased;
                changed = control.changed() => {
                    if changed.is_err() {
                        return Ok(Control::Lost);
                    }
                }
                Some((line, custom_id, reply)) = running.next(), if !running.is_empty() => {
                    let result = result_line(line, &custom_id, reply);
                    let counter = if result.ok { &self.counters.completed } else { &self.counters.failed };
                    if !self.store.add_batch_result(&batch.id, worker, &result).await? {
                        return Ok(Control::Lost);
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                permit = self.inflight.clone().acquire_owned(), if !pending.is_empty() => {
                    let Ok(permit) = permit else { return Ok(Control::Lost) };
                    let Some(request) = pending.pop_front().map(|i| &requests[i]) else { continue };
                    let endpoints = self.endpoints.clone();
                    let (project, endpoint) = (batch.project_id.clone(), batch.endpoint.clone());
                    let (line, custom_id, body) =
                        (request.line, request.input.custom_id.clone(), request.input.body.clone());
                    let stop = control.clone();
                    let key = format!("{}:{line}", batch.id);
                    running.push(Box::pin(async move {
                        let reply = run_with_retry(&*endpoints, project, endpoint, body, key, stop).await;
                        drop(permit);
                        (line, custom_id, reply)
                    }));
                }
            }
        }
    }

    /// The lines that already have a result.
    async fn done_lines(&self, batch: &Batch) -> Result<HashSet<i64>, Stop> {
        let lines = self.store.batch_result_lines(&batch.id).await?;
        Ok(lines.into_iter().collect())
    }

    /// Writes the result files from the recorded results (plus `extra`
    /// error lines) and ends the batch as `status`.
    async fn end(
        &self,
        batch: &Batch,
        status: BatchStatus,
        extra: Vec<String>,
    ) -> Result<BatchStatus, Stop> {
        let (mut output, mut errors) = (Vec::new(), Vec::new());
        let mut after = -1;
        loop {
            let page = self
                .store
                .batch_results(&batch.id, after, RESULT_PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.line;
            for r in &page {
                let out = if r.ok { &mut output } else { &mut errors };
                out.extend_from_slice(r.body.as_bytes());
                out.push(b'\n');
            }
        }
        for line in extra {
            errors.extend_from_slice(line.as_bytes());
            errors.push(b'\n');
        }
        let output_file = self.result_file(batch, "output", &output).await?;
        let error_file = self.result_file(batch, "error", &errors).await?;
        let applied = self
            .store
            .finish_batch(
                &batch.id,
                &self.config.worker_id,
                status,
                output_file.as_deref(),
                error_file.as_deref(),
            )
            .await?;
        if !applied {
            // Not ours any more: the files written are not the batch's.
            for file in output_file.iter().chain(error_file.iter()) {
                let _ = self.store.delete_file(&batch.project_id, file).await;
            }
            return Err(Stop::Control(Control::Lost));
        }
        Ok(status)
    }

    async fn result_file(
        &self,
        batch: &Batch,
        kind: &str,
        bytes: &[u8],
    ) -> Result<Option<String>, Stop> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let name = format!("{}_{kind}.jsonl", batch.id);
        let file = self
            .store
            .create_file_from_bytes(&batch.project_id, &name, PURPOSE_BATCH_OUTPUT, bytes)
            .await?;
        Ok(Some(file.id))
    }
}

/// Statuses that mean "not now" rather than "this request is wrong": the
/// request waits and is tried again.
fn is_busy(status: u16) -> bool {
    matches!(status, 429 | 503 | 529)
}

/// Runs a request, trying again while the server is busy (the batch has
/// until its window to finish; an overloaded engine is no reason to fail a
/// line) unless the batch is told to stop.
async fn run_with_retry(
    endpoints: &dyn BatchEndpoints,
    project: String,
    endpoint: String,
    body: serde_json::Map<String, Value>,
    line_key: String,
    control: watch::Receiver<Control>,
) -> EndpointReply {
    let mut wait = Duration::from_millis(100);
    loop {
        let reply = endpoints
            .run(
                project.clone(),
                endpoint.clone(),
                body.clone(),
                line_key.clone(),
            )
            .await;
        if !is_busy(reply.status) || *control.borrow() != Control::Run {
            return reply;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// The `{code, message}` of an error reply, from its body's `message` or
/// `detail`.
fn reply_error(reply: &EndpointReply) -> BatchLineError {
    let message = reply
        .body
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| reply.body.get("detail").and_then(Value::as_str))
        .map(str::to_string)
        .or_else(|| {
            let first = reply.body.get("detail")?.as_array()?.first()?;
            let msg = first.get("msg")?.as_str()?;
            let loc = first.get("loc").map(|l| l.to_string()).unwrap_or_default();
            Some(format!("{msg} at {loc}"))
        })
        .unwrap_or_else(|| format!("the request failed with status {}", reply.status));
    let code = match reply.status {
        400 | 413 | 422 => "invalid_request",
        401 | 403 => "permission_denied",
        404 => "not_found",
        429 | 503 | 529 => "server_busy",
        _ => "server_error",
    };
    BatchLineError {
        code: code.to_string(),
        message,
    }
}

/// The result of line `line`: its output-file line when the endpoint
/// answered 200, else its error-file line (with the error reply).
fn result_line(line: i64, custom_id: &str, reply: EndpointReply) -> BatchResult {
    let ok = reply.status == 200;
    let request_id = reply
        .body
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("req_{}", hearth_store::ids::random_hex()));
    let error = (!ok).then(|| reply_error(&reply));
    let out = BatchOutputLine {
        id: format!("batch_req_{}", hearth_store::ids::random_hex()),
        custom_id: custom_id.to_string(),
        response: Some(BatchResponse {
            status_code: reply.status,
            request_id,
            body: reply.body,
        }),
        error,
    };
    BatchResult {
        line,
        ok,
        body: serde_json::to_string(&out).unwrap_or_else(|_| json!({}).to_string()),
    }
}

/// An error-file line for a request that never got an answer.
fn failure_line(
    custom_id: &str,
    response: Option<BatchResponse>,
    code: &str,
    message: String,
) -> String {
    let out = BatchOutputLine {
        id: format!("batch_req_{}", hearth_store::ids::random_hex()),
        custom_id: custom_id.to_string(),
        response,
        error: Some(BatchLineError {
            code: code.to_string(),
            message,
        }),
    };
    serde_json::to_string(&out).unwrap_or_default()
}

/// Renews the claim every `config.heartbeat` and tells the batch what its
/// status says: cancelled, expired, or no longer this worker's.
async fn heartbeat(
    store: Store,
    batch: Batch,
    config: BatchWorkerConfig,
    tx: watch::Sender<Control>,
) {
    loop {
        tokio::time::sleep(config.heartbeat).await;
        let control = match store.heartbeat_batch(&batch.id, &config.worker_id).await {
            Ok(None) => Control::Lost,
            Ok(Some(BatchStatus::Cancelling)) => Control::Cancel,
            Ok(Some(_)) if hearth_store::ids::now() >= batch.expires_at => Control::Expire,
            Ok(Some(_)) => Control::Run,
            Err(e) => {
                tracing::warn!(batch = %batch.id, error = %e, "batch heartbeat failed");
                continue;
            }
        };
        if control != Control::Run {
            let _ = tx.send(control);
            if control == Control::Lost {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_go_to_the_right_file() {
        let ok = result_line(
            1,
            "a",
            EndpointReply {
                status: 200,
                body: json!({"id": "chatcmpl-1", "object": "chat.completion"}),
            },
        );
        assert!(ok.ok);
        let line: BatchOutputLine = serde_json::from_str(&ok.body).unwrap();
        assert_eq!(line.custom_id, "a");
        assert!(line.error.is_none());
        assert_eq!(line.response.unwrap().request_id, "chatcmpl-1");
        let bad = result_line(
            2,
            "b",
            EndpointReply {
                status: 404,
                body: json!({"detail": "Model 'x' not found"}),
            },
        );
        assert!(!bad.ok);
        let line: BatchOutputLine = serde_json::from_str(&bad.body).unwrap();
        let error = line.error.unwrap();
        assert_eq!(
            (error.code.as_str(), error.message.as_str()),
            ("not_found", "Model 'x' not found")
        );
        assert_eq!(line.response.unwrap().status_code, 404);
    }
}
