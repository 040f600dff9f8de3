//! Requests with any body (multipart forms) through the in-process router,
//! and the error-shape checks the files and admin tests share.

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::KEY;
use hearth_server::AppState;

pub const BOUNDARY: &str = "hearth-test-boundary-7MA4YWxkTrZu0gW";

/// A multipart body: `(name, filename, content)` per field.
pub fn form(fields: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, filename, content) in fields {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match filename {
            Some(f) => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

pub struct Raw {
    pub status: u16,
    pub headers: axum::http::HeaderMap,
    pub bytes: Vec<u8>,
}

impl Raw {
    /// Asserts the status, showing the body when it differs.
    pub fn expect_status(&self, status: u16) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.bytes)
        );
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.bytes)))
    }
}

pub async fn request(
    state: &AppState,
    method: &str,
    uri: &str,
    key: Option<&str>,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Raw {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "files.test");
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    let response = hearth_server::app(state.clone())
        .oneshot(builder.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Raw {
        status,
        headers,
        bytes,
    }
}

/// `POST uri` with a JSON body and the extra key.
pub async fn post_json(state: &AppState, uri: &str, body: &Value) -> Raw {
    request(
        state,
        "POST",
        uri,
        Some(KEY),
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

pub async fn upload_as(
    state: &AppState,
    key: &str,
    uri: &str,
    purpose: &str,
    name: &str,
    content: &[u8],
) -> Raw {
    let body = form(&[
        ("purpose", None, purpose.as_bytes()),
        ("file", Some(name), content),
    ]);
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    request(state, "POST", uri, Some(key), Some(&ct), body).await
}

pub async fn upload(state: &AppState, purpose: &str, content: &[u8]) -> Value {
    let reply = upload_as(state, KEY, "/v1/files", purpose, "data.jsonl", content).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    reply.json()
}

pub async fn get(state: &AppState, uri: &str, key: Option<&str>) -> Raw {
    request(state, "GET", uri, key, None, Vec::new()).await
}

pub fn shape_a(reply: &Raw, status: u16) -> String {
    assert_eq!(
        reply.status,
        status,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let body = reply.json();
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    body["detail"].as_str().expect("shape A").to_string()
}

pub fn shape_c(reply: &Raw) -> Value {
    assert_eq!(
        reply.status,
        422,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    reply.json()["detail"][0].clone()
}

/// A second project with a key of its own.
pub async fn other_project(state: &AppState) -> (String, String) {
    // On the test's own runtime: see `fine_tuning.rs` on stranded connections.
    let project = state.store.create_project("Other").await.unwrap();
    let key = state
        .store
        .create_key("other", Some(&project.id), false)
        .await
        .unwrap();
    (project.id, key.secret)
}

/// The body as text (for assertion messages).
pub fn text(reply: &Raw) -> String {
    String::from_utf8_lossy(&reply.bytes).to_string()
}

/// A request with a JSON body (`Some`) or none, as `key`.
pub async fn call(
    state: &AppState,
    method: &str,
    uri: &str,
    key: &str,
    body: Option<Value>,
) -> Raw {
    match body {
        Some(body) => {
            request(
                state,
                method,
                uri,
                Some(key),
                Some("application/json"),
                body.to_string().into_bytes(),
            )
            .await
        }
        None => request(state, method, uri, Some(key), None, Vec::new()).await,
    }
}

/// A key whose account reaches the default project (its default) and a
/// second project `a`; returns (key, a).
pub async fn two_project_key(state: &AppState) -> (String, String) {
    let store = &state.store;
    let a = store.create_project("A").await.unwrap().id;
    let key = store
        .create_key("two", Some(&state.default_project), false)
        .await
        .unwrap();
    store.grant_project(&key.info.account_id, &a).await.unwrap();
    (key.secret, a)
}

/// A 400 shape-B body naming `param`; returns the message.
pub fn shape_b_param(reply: &Raw, param: Option<&str>) -> String {
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let body = reply.json();
    assert_eq!(body["error"]["type"], "BadRequestError", "{body}");
    assert_eq!(body["error"]["code"], 400, "{body}");
    assert_eq!(body["error"]["param"].as_str(), param, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with(hearth_api::INVALID_REQUEST_PREFIX),
        "{body}"
    );
    body["error"]["message"].as_str().unwrap().to_string()
}
