//! Requests for a model this node does not serve go to a node that does.
//!
//! On the inference routes, after the key is checked, the body's `model` is
//! looked up: a model served here (chat, embedding or image model, a
//! catalogue adapter) or a dedicated endpoint with replicas here is answered
//! here. Otherwise the alive nodes of the store's registry (`crate::nodes`)
//! that list exactly that name (models, and the routing keys of the
//! endpoints they run) are asked, the least loaded first (fewest sequences
//! running and waiting), and the request is sent on unchanged (method,
//! path, query, key, body) to its advertised URL; the answer, a stream
//! included, comes back as it is produced. A forwarded request carries
//! `x-hearth-forwarded` and is never forwarded again; every answer says
//! which node made it in `x-hearth-node`. When only nodes that are gone
//! list the model, the answer is 503 (shape B); when no node lists it, the
//! local handler answers as before (404 for an unknown model). A name whose
//! base before `:` is served here (fine-tuned models, endpoint routing
//! keys) is answered here when no alive node lists it.

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use crate::error::HttpError;
use crate::state::AppState;

/// Marks a request that one node already forwarded.
pub const FORWARDED: &str = "x-hearth-forwarded";

/// On every answer of the inference routes: the id of the node that made
/// it.
pub const NODE: &str = "x-hearth-node";

#[derive(Deserialize)]
struct ModelField {
    #[serde(default)]
    model: Option<String>,
}

/// Whether this node serves `model` itself (a chat, embedding or image
/// model, or a catalogue adapter).
fn served_here(state: &AppState, model: &str) -> bool {
    state.local_models().any(|id| id == model)
}

/// Whether this node serves the base before `model`'s first `:` (a
/// fine-tuned model's, or a dedicated endpoint's).
fn base_served_here(state: &AppState, model: &str) -> bool {
    model
        .split_once(':')
        .is_some_and(|(base, _)| served_here(state, base))
}

/// The middleware of the inference routes.
pub async fn forward_remote(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if state.node.id.is_empty() {
        return next.run(request).await;
    }
    if request.headers().contains_key(FORWARDED) {
        let mut response = next.run(request).await;
        answered_by(&state, &mut response);
        return response;
    }
    let limit = crate::app::MAX_BODY_BYTES;
    if crate::error::declared_too_large(request.headers(), limit) {
        return HttpError(ApiError::payload_too_large(limit)).into_response();
    }
    let (parts, body) = request.into_parts();
    let bytes = match to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => return crate::error::body_error(&e, limit).into_response(),
    };
    let model = serde_json::from_slice::<ModelField>(&bytes)
        .ok()
        .and_then(|m| m.model)
        .filter(|m| !m.is_empty());
    // A model or endpoint with replicas here is answered here. A name
    // whose base is served here (a fine-tuned model, a dedicated endpoint
    // that may run on another node) goes to a node that lists it exactly,
    // if one is alive; else it is answered here too.
    let model = model
        .filter(|m| !served_here(&state, m) && !state.endpoints.hosts_here(m))
        .map(|m| (base_served_here(&state, &m), m));
    if let Some((base_here, model)) = model {
        match remote_for(&state, &model).await {
            Remote::Alive(url) => return proxy(&state, &url, parts, bytes).await,
            // The local handler answers (an adapter, or why an endpoint
            // has no replica).
            Remote::Gone | Remote::Nobody if base_here => {}
            Remote::Gone => {
                return HttpError(ApiError::unavailable(format!(
                    "The nodes serving `{model}` are not reachable now; try again later."
                )))
                .into_response()
            }
            Remote::Nobody => {}
        }
    }
    let mut response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    answered_by(&state, &mut response);
    response
}

/// Says which node answered (a forwarded answer keeps the header of the
/// node that made it).
fn answered_by(state: &AppState, response: &mut Response) {
    if let Ok(id) = HeaderValue::from_str(&state.node.id) {
        response.headers_mut().insert(NODE, id);
    }
}

enum Remote {
    /// The advertised URL of the least loaded alive node serving it.
    Alive(String),
    /// Only nodes that are gone list it.
    Gone,
    Nobody,
}

async fn remote_for(state: &AppState, model: &str) -> Remote {
    let nodes = match state.store.nodes().await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("reading the nodes: {e}");
            return Remote::Nobody;
        }
    };
    let now = hearth_store::ids::now();
    let listing: Vec<_> = nodes
        .iter()
        .filter(|n| *n.id != *state.node.id && n.models.iter().any(|m| m == model))
        .filter(|n| n.advertise_url.is_some())
        .collect();
    if listing.is_empty() {
        return Remote::Nobody;
    }
    let load = |c: &serde_json::Value| {
        c["sequences_running"].as_u64().unwrap_or(0) + c["sequences_waiting"].as_u64().unwrap_or(0)
    };
    match listing
        .iter()
        .filter(|n| n.alive_at(now, state.node.timeout_secs))
        .min_by_key(|n| load(&n.capacity))
    {
        Some(n) => Remote::Alive(n.advertise_url.clone().expect("filtered")),
        None => Remote::Gone,
    }
}

/// Sends the request to `base` and streams its answer back.
async fn proxy(
    state: &AppState,
    base: &str,
    mut parts: axum::http::request::Parts,
    body: bytes::Bytes,
) -> Response {
    let unreachable = |why: String| {
        tracing::warn!("forwarding to {base}: {why}");
        HttpError(ApiError::unavailable(
            "The node serving this model cannot be reached; try again later.",
        ))
        .into_response()
    };
    let Ok(target) = base.parse::<Uri>() else {
        return unreachable("not a URL".into());
    };
    let (Some(host), Some("http")) = (target.host(), target.scheme_str()) else {
        return unreachable("only http:// URLs are forwarded to".into());
    };
    let port = target.port_u16().unwrap_or(80);
    let stream = match tokio::net::TcpStream::connect((host, port)).await {
        Ok(s) => s,
        Err(e) => return unreachable(e.to_string()),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return unreachable(e.to_string()),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("forwarded connection: {e}");
        }
    });
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = path.parse().expect("a path and query");
    parts.headers.insert(
        FORWARDED,
        HeaderValue::from_str(&state.node.id).unwrap_or(HeaderValue::from_static("node")),
    );
    if let Ok(h) = HeaderValue::from_str(&format!("{host}:{port}")) {
        parts.headers.insert(axum::http::header::HOST, h);
    }
    let request = hyper::Request::from_parts(parts, Body::from(body));
    match sender.send_request(request).await {
        Ok(answer) => {
            let (parts, incoming) = answer.into_parts();
            Response::from_parts(parts, Body::new(incoming))
        }
        Err(e) => unreachable(e.to_string()),
    }
}
