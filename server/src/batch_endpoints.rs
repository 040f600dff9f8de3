//! How batches reach the endpoints: [`ServerEndpoints`] runs each line of a
//! batch through the same handler as its HTTP route (parsing, validation,
//! model resolution, sampling, errors), in the batch's project, with the
//! engine's batch priority; and checks lines with the routes' own
//! `prepare` steps before a batch runs.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hearth_api::{parse_json_body, ApiError, ProjectQuery};
use hearth_core::Priority;
use hearth_jobs::batch::{BatchEndpoints, BoxFuture, EndpointReply};
use hearth_jobs::{BatchWorker, BatchWorkerConfig, BatchWorkerHandle};
use hearth_store::Caller;
use serde_json::{Map, Value};

use crate::auth::RequestContext;
use crate::config::BatchArgs;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::routes;
use crate::state::AppState;

/// Largest response body read back from a handler (a whole completion or
/// a list of embeddings is far smaller).
const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// The server's endpoints, for the batch worker.
#[derive(Clone)]
pub struct ServerEndpoints {
    pub state: AppState,
}

/// The context a batch's request runs in: its project (and only it), no
/// admin rights, batch priority.
pub(crate) fn batch_context(project: String) -> RequestContext {
    RequestContext {
        caller: Caller {
            key_id: None,
            account_id: None,
            is_admin: false,
            default_project_id: project.clone(),
            last_used_at: None,
            service_account_id: None,
            read_only: false,
        },
        project_id: project,
        project_named: true,
        priority: Priority::Batch,
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Map<String, Value>) -> Result<T, HttpError> {
    let bytes = serde_json::to_vec(body).map_err(|_| HttpError(ApiError::internal()))?;
    Ok(parse_json_body(&bytes)?)
}

fn unknown_endpoint(endpoint: &str) -> HttpError {
    HttpError(ApiError::bad_request(
        Some("url"),
        format!("`{endpoint}` is not an endpoint batches can run."),
    ))
}

/// The model a body names after the route's checks, or the error it gets.
async fn check(
    state: &AppState,
    project: String,
    endpoint: &str,
    body: &Map<String, Value>,
) -> Result<String, HttpError> {
    match endpoint {
        "/v1/chat/completions" => {
            let (valid, ..) = routes::chat::prepare(state, &project, parse(body)?).await?;
            Ok(valid.model)
        }
        "/v1/completions" => {
            let (valid, ..) = routes::completions::prepare(state, &project, parse(body)?).await?;
            Ok(valid.model)
        }
        "/v1/embeddings" => Ok(routes::embeddings::prepare(state, &project, parse(body)?)?
            .0
            .model),
        "/v1/responses" => {
            let ctx = batch_context(project);
            let prepared = routes::responses::prepare(state, &ctx, parse(body)?).await?;
            Ok(prepared.valid.model)
        }
        other => Err(unknown_endpoint(other)),
    }
}

/// Runs the handler of `endpoint` on `body`; its response, success or error.
/// A stored response is named after `line_key` (see [`line_response_id`]).
async fn run(
    state: AppState,
    project: String,
    endpoint: &str,
    body: Map<String, Value>,
    line_key: &str,
) -> Response {
    let ctx = batch_context(project);
    let query = ApiQuery(ProjectQuery::default());
    let answer = match endpoint {
        "/v1/chat/completions" => match parse(&body) {
            Ok(request) => {
                routes::chat::create(State(state), query, Extension(ctx), ApiJson(request)).await
            }
            Err(e) => Err(e),
        },
        "/v1/completions" => match parse(&body) {
            Ok(request) => {
                routes::completions::create(State(state), query, Extension(ctx), ApiJson(request))
                    .await
            }
            Err(e) => Err(e),
        },
        "/v1/embeddings" => match parse(&body) {
            Ok(request) => {
                routes::embeddings::create(State(state), query, Extension(ctx), ApiJson(request))
                    .await
                    .map(Json::into_response)
            }
            Err(e) => Err(e),
        },
        "/v1/responses" => match parse(&body) {
            Ok(request) => {
                let id = line_response_id(line_key);
                routes::responses::respond(state, ctx, request, Some(id)).await
            }
            Err(e) => Err(e),
        },
        other => Err(unknown_endpoint(other)),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// The id of the response a batch line keeps: `resp_` and 32 hex digits
/// as a random one has, from a hash of the line's key, so that the run of
/// a line after a restart replaces the response its first run kept.
pub(crate) fn line_response_id(line_key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("batch line {line_key}").as_bytes());
    format!("resp_{}", hex::encode(&digest[..16]))
}

/// A handler's response as a status and a JSON body.
async fn reply(response: Response) -> EndpointReply {
    let status = response.status().as_u16();
    let body = match axum::body::to_bytes(response.into_body(), MAX_REPLY_BYTES).await {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) => {
            tracing::error!(error = %e, "a batch request's answer could not be read");
            return EndpointReply {
                status: 500,
                body: ApiError::internal().body_json(),
            };
        }
    };
    EndpointReply { status, body }
}

impl BatchEndpoints for ServerEndpoints {
    fn check(
        &self,
        project: String,
        endpoint: String,
        body: Map<String, Value>,
    ) -> BoxFuture<Result<String, String>> {
        let state = self.state.clone();
        Box::pin(async move {
            check(&state, project, &endpoint, &body)
                .await
                .map_err(|e| e.0.message())
        })
    }

    fn run(
        &self,
        project: String,
        endpoint: String,
        body: Map<String, Value>,
        line_key: String,
    ) -> BoxFuture<EndpointReply> {
        let state = self.state.clone();
        Box::pin(async move { reply(run(state, project, &endpoint, body, &line_key).await).await })
    }
}

/// Starts this node's batch worker (none with `--batch-workers 0`).
pub fn start_worker(state: &AppState, args: &BatchArgs) -> Option<BatchWorkerHandle> {
    if args.batch_workers == 0 {
        tracing::info!("no batch worker on this node (--batch-workers 0)");
        return None;
    }
    let config = BatchWorkerConfig {
        worker_id: state.node.worker_id(),
        stale_after_secs: state.node.timeout_secs,
        batches: args.batch_workers,
        max_inflight: args.batch_max_inflight,
        max_lines: args.batch_max_lines,
        ..BatchWorkerConfig::default()
    };
    let endpoints = Arc::new(ServerEndpoints {
        state: state.clone(),
    });
    let worker = BatchWorker::new(
        state.store.clone(),
        endpoints,
        config,
        state.batch_counters.clone(),
    );
    Some(worker.spawn())
}

#[cfg(test)]
mod tests {
    use super::line_response_id;

    #[test]
    fn a_line_s_response_id_is_the_same_on_every_run_and_shaped_as_a_random_one() {
        let id = line_response_id("batch_abc:3");
        assert_eq!(id, line_response_id("batch_abc:3"));
        assert_ne!(id, line_response_id("batch_abc:4"));
        assert_ne!(id, line_response_id("batch_abd:3"));
        let hex = id.strip_prefix("resp_").expect("resp_ prefix");
        assert_eq!(hex.len(), 32);
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
