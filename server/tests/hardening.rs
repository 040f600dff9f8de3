//! By-id routes across the caller's projects, request limits, JSON errors
//! for every rejection, health probes, metrics access and CORS.

mod common;

use common::raw::*;
use common::*;
use hearth_server::AppState;
use serde_json::{json, Value};

const TRAINING: &str = concat!(
    r#"{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}"#,
    "\n",
);

async fn json_as(state: &AppState, method: &str, uri: &str, key: &str, body: Value) -> Raw {
    call(state, method, uri, key, Some(body)).await
}

#[tokio::test]
async fn files_are_found_by_id_in_any_project_of_the_key() {
    let state = bare_state();
    let (key, a) = two_project_key(&state).await;
    let up = upload_as(
        &state,
        &key,
        &format!("/v1/files?ai_project_id={a}"),
        "fine-tune",
        "t.jsonl",
        TRAINING.as_bytes(),
    )
    .await;
    assert_eq!(up.status, 200, "{}", text(&up));
    let id = up.json()["id"].as_str().unwrap().to_string();

    // Without the query: found in project A.
    let got = get(&state, &format!("/v1/files/{id}"), Some(&key)).await;
    assert_eq!(got.status, 200, "{}", text(&got));
    assert_eq!(got.json()["id"], id.as_str());
    let content = get(&state, &format!("/v1/files/{id}/content"), Some(&key)).await;
    assert_eq!(content.bytes, TRAINING.as_bytes());
    let link = get(&state, &format!("/v1/files/{id}/link"), Some(&key)).await;
    assert_eq!(link.status, 200, "{}", text(&link));
    // Naming the project it is in: found; naming another one: 403.
    let named = get(
        &state,
        &format!("/v1/files/{id}?ai_project_id={a}"),
        Some(&key),
    )
    .await;
    assert_eq!(named.status, 200);
    let wrong = get(
        &state,
        &format!("/v1/files/{id}?ai_project_id={}", state.default_project),
        Some(&key),
    )
    .await;
    let wrong_detail = shape_a(&wrong, 403);

    // Another account: 403, the same body as a file that does not exist.
    let (_, stranger) = other_project(&state).await;
    let theirs = get(&state, &format!("/v1/files/{id}"), Some(&stranger)).await;
    let missing = get(&state, "/v1/files/file-doesnotexist", Some(&stranger)).await;
    assert_eq!(shape_a(&theirs, 403), shape_a(&missing, 403));
    assert_eq!(shape_a(&theirs, 403), wrong_detail);
    let delete_theirs = request(
        &state,
        "DELETE",
        &format!("/v1/files/{id}"),
        Some(&stranger),
        None,
        vec![],
    )
    .await;
    shape_a(&delete_theirs, 403);

    // Delete by id without the query.
    let deleted = request(
        &state,
        "DELETE",
        &format!("/v1/files/{id}"),
        Some(&key),
        None,
        vec![],
    )
    .await;
    assert_eq!(deleted.status, 200, "{}", text(&deleted));
    let gone = get(&state, &format!("/v1/files/{id}"), Some(&key)).await;
    shape_a(&gone, 403);
}

#[tokio::test]
async fn fine_tuning_jobs_are_found_by_id_in_any_project_of_the_key() {
    let (store, project) = new_store();
    let state = AppState {
        store,
        default_project: project.into(),
        ..with_model()
    };
    let (key, a) = two_project_key(&state).await;
    let up = upload_as(
        &state,
        &key,
        &format!("/v1/files?ai_project_id={a}"),
        "fine-tune",
        "t.jsonl",
        TRAINING.as_bytes(),
    )
    .await;
    let file = up.json()["id"].as_str().unwrap().to_string();
    let created = json_as(
        &state,
        "POST",
        &format!("/v1/fine_tuning/jobs?ai_project_id={a}"),
        &key,
        json!({"model": MODEL, "training_file": file}),
    )
    .await;
    assert_eq!(created.status, 200, "{}", text(&created));
    let job = created.json()["id"].as_str().unwrap().to_string();

    for path in [
        format!("/v1/fine_tuning/jobs/{job}"),
        format!("/v1/fine_tuning/jobs/{job}/events"),
        format!("/v1/fine_tuning/jobs/{job}/checkpoints"),
    ] {
        let reply = get(&state, &path, Some(&key)).await;
        assert_eq!(reply.status, 200, "{path}: {}", text(&reply));
    }
    let (_, stranger) = other_project(&state).await;
    for path in [
        format!("/v1/fine_tuning/jobs/{job}"),
        format!("/v1/fine_tuning/jobs/{job}/events"),
    ] {
        shape_a(&get(&state, &path, Some(&stranger)).await, 403);
    }
    let cancel_theirs = request(
        &state,
        "POST",
        &format!("/v1/fine_tuning/jobs/{job}/cancel"),
        Some(&stranger),
        None,
        vec![],
    )
    .await;
    shape_a(&cancel_theirs, 403);
    let cancelled = request(
        &state,
        "POST",
        &format!("/v1/fine_tuning/jobs/{job}/cancel"),
        Some(&key),
        None,
        vec![],
    )
    .await;
    assert_eq!(cancelled.status, 200, "{}", text(&cancelled));
    assert_eq!(cancelled.json()["status"], "cancelled");
}

#[tokio::test]
async fn a_duplicated_project_query_is_422() {
    let state = bare_state();
    let pid = state.default_project.to_string();
    let reply = get(
        &state,
        &format!("/v1/files?ai_project_id={pid}&ai_project_id={pid}"),
        Some(KEY),
    )
    .await;
    let item = shape_c(&reply);
    assert_eq!(item["loc"], json!(["query", "ai_project_id"]), "{item}");
}

#[tokio::test]
async fn undecodable_paths_and_bodies_answer_json() {
    let state = bare_state();
    let reply = get(&state, "/v1/files/%FF", Some(KEY)).await;
    let item = shape_c(&reply);
    assert_eq!(item["loc"][0], "path", "{item}");
    // A key given twice in a body.
    let reply = json_request(
        &state,
        "/v1/embeddings",
        r#"{"model": "m", "model": "n", "input": "x"}"#,
    )
    .await;
    assert_eq!(reply.status, 422, "{}", text(&reply));
    // A body that is valid JSON but not an object.
    let reply = json_request(&state, "/v1/embeddings", "[1, 2]").await;
    assert_eq!(shape_c(&reply)["type"], "model_attributes_type");
    // Wrong method and unknown route: JSON shape A.
    shape_a(
        &request(&state, "PUT", "/v1/files", Some(KEY), None, vec![]).await,
        405,
    );
    shape_a(&get(&state, "/v1/nothing-here", Some(KEY)).await, 404);
    // The server still answers normally.
    assert_eq!(get(&state, "/v1/files", Some(KEY)).await.status, 200);
}

async fn json_request(state: &AppState, uri: &str, body: &str) -> Raw {
    request(
        state,
        "POST",
        uri,
        Some(KEY),
        Some("application/json"),
        body.as_bytes().to_vec(),
    )
    .await
}

#[tokio::test]
async fn oversized_form_fields_are_refused() {
    let state = bare_state();
    let purpose = vec![b'x'; 100 * 1024];
    let body = form(&[
        ("purpose", None, &purpose),
        ("file", Some("a.jsonl"), b"{}\n"),
    ]);
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let reply = request(&state, "POST", "/v1/files", Some(KEY), Some(&ct), body).await;
    let detail = shape_a(&reply, 400);
    assert!(detail.contains("at most"), "{detail}");
    let listed = get(&state, "/v1/files", Some(KEY)).await.json();
    assert_eq!(listed["data"], json!([]), "nothing was stored");
    // A dataset part's other fields likewise.
    let upload = json_as(
        &state,
        "POST",
        "/v1/datasets/uploads",
        KEY,
        json!({"name": "d", "schema": [{"name": "q", "type": {"name": "string"}}]}),
    )
    .await;
    assert_eq!(upload.status, 200, "{}", text(&upload));
    let id = upload.json()["id"].as_str().unwrap().to_string();
    let body = form(&[
        ("note", None, &purpose),
        ("data", Some("p.jsonl"), b"{\"q\": \"a\"}\n"),
    ]);
    let uri = format!("/v1/datasets/uploads/{id}/parts");
    let reply = request(&state, "POST", &uri, Some(KEY), Some(&ct), body).await;
    let detail = shape_a(&reply, 400);
    assert!(detail.contains("at most"), "{detail}");
    let body = form(&[
        ("note", None, b"small"),
        ("data", Some("p.jsonl"), b"{\"q\": \"a\"}\n"),
    ]);
    let reply = request(&state, "POST", &uri, Some(KEY), Some(&ct), body).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
}

#[tokio::test]
async fn health_probes_and_metrics_access() {
    let mut state = bare_state();
    for path in ["/health", "/health/live", "/health/ready"] {
        let reply = get(&state, path, None).await;
        assert_eq!(reply.status, 200, "{path}");
        assert_eq!(reply.json()["status"], "ok");
    }
    // Metrics need a key unless made public.
    shape_a(&get(&state, "/metrics", None).await, 401);
    assert_eq!(get(&state, "/metrics", Some(KEY)).await.status, 200);
    state.http.metrics_public = true;
    assert_eq!(get(&state, "/metrics", None).await.status, 200);
    // Draining: not ready, still live.
    state
        .http
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(&state, "/health/ready", None).await.status, 503);
    assert_eq!(get(&state, "/health", None).await.status, 503);
    assert_eq!(get(&state, "/health/live", None).await.status, 200);
}

#[tokio::test]
async fn cors_answers_configured_origins_only() {
    let mut state = bare_state();
    state.http.cors_origins = vec!["https://console.example".to_string()].into();
    let preflight = |origin: &'static str| {
        let state = state.clone();
        async move {
            let req = axum::http::Request::builder()
                .method("OPTIONS")
                .uri("/v1/models")
                .header("origin", origin)
                .header("access-control-request-method", "POST")
                .header(
                    "access-control-request-headers",
                    "authorization,content-type,x-stainless-lang",
                )
                .body(axum::body::Body::empty())
                .unwrap();
            tower::ServiceExt::oneshot(hearth_server::app(state), req)
                .await
                .unwrap()
        }
    };
    let ok = preflight("https://console.example").await;
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "https://console.example"
    );
    let allowed = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(allowed.contains("x-stainless-lang"), "{allowed}");
    let other = preflight("https://evil.example").await;
    assert!(other.headers().get("access-control-allow-origin").is_none());
    // Without configured origins there are no CORS headers at all.
    let reply = get(&bare_state(), "/v1/models", Some(KEY)).await;
    assert!(reply.headers.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn every_response_names_its_request() {
    let state = bare_state();
    let id = |reply: &Raw| {
        let id = reply.headers["x-request-id"].to_str().unwrap().to_string();
        assert!(
            id.len() == 36
                && id.starts_with("req_")
                && id[4..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        id
    };
    let ok = get(&state, "/v1/models", Some(KEY)).await;
    ok.expect_status(200);
    let refused = get(&state, "/v1/models", Some("wrong")).await;
    refused.expect_status(401);
    assert_ne!(id(&ok), id(&refused), "each request its own id");
    // Browsers may read it from other origins.
    let mut state = bare_state();
    state.http.cors_origins = vec!["https://console.example".to_string()].into();
    let req = axum::http::Request::builder()
        .uri("/v1/models")
        .header("origin", "https://console.example")
        .header("authorization", format!("Bearer {KEY}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let reply = tower::ServiceExt::oneshot(hearth_server::app(state), req)
        .await
        .unwrap();
    let exposed = reply.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(exposed.contains("x-request-id"), "{exposed}");
}

#[tokio::test]
async fn generation_limits_are_400_naming_the_field() {
    let state = with_model();
    let check = |reply: &Raw, param: &str| {
        assert_eq!(reply.status, 400, "{}", text(reply));
        let body = reply.json();
        assert_eq!(body["error"]["param"], param, "{body}");
        assert_eq!(body["error"]["type"], "BadRequestError", "{body}");
    };
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let reply = json_as(
        &state,
        "POST",
        "/v1/chat/completions",
        KEY,
        chat(json!({"max_tokens": 1_000_000_000_000i64})),
    )
    .await;
    check(&reply, "max_tokens");
    let reply = json_as(
        &state,
        "POST",
        "/v1/chat/completions",
        KEY,
        chat(json!({"max_completion_tokens": 9_000_000})),
    )
    .await;
    check(&reply, "max_completion_tokens");
    let reply = json_as(
        &state,
        "POST",
        "/v1/completions",
        KEY,
        json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1_000_000_000_000i64}),
    )
    .await;
    check(&reply, "max_tokens");
    // Prompts x n over the per-request cap (64).
    let prompts: Vec<&str> = vec!["a"; 8];
    let reply = json_as(
        &state,
        "POST",
        "/v1/completions",
        KEY,
        json!({"model": MODEL, "prompt": prompts, "n": 9, "max_tokens": 1}),
    )
    .await;
    check(&reply, "n");
    // A stop string over 256 bytes.
    let reply = json_as(
        &state,
        "POST",
        "/v1/chat/completions",
        KEY,
        chat(json!({"stop": "x".repeat(300)})),
    )
    .await;
    check(&reply, "stop");
    // Prompt text over the byte cap, refused before tokenizing.
    let mut small = state.clone();
    small.limits.max_prompt_bytes = 1000;
    let reply = json_as(
        &small,
        "POST",
        "/v1/completions",
        KEY,
        json!({"model": MODEL, "prompt": "y".repeat(2000), "max_tokens": 1}),
    )
    .await;
    check(&reply, "prompt");
    let reply = json_as(
        &small,
        "POST",
        "/v1/chat/completions",
        KEY,
        chat(json!({"messages": [{"role": "user", "content": "y".repeat(2000)}]})),
    )
    .await;
    check(&reply, "messages");

    // After all that, a normal request is answered.
    let reply = json_as(
        &state,
        "POST",
        "/v1/chat/completions",
        KEY,
        chat(json!({"max_tokens": 4, "ignore_eos": true})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(reply.json()["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn requests_beyond_the_concurrency_limit_get_503_then_pass_again() {
    // An engine of its own, so other tests' sequences do not count.
    let mut state = with_tiny_queue();
    state.http.max_concurrent = 1;
    let app = hearth_server::app(state.clone());
    let call = |app: axum::Router, uri: &'static str, body: Option<Value>| async move {
        let mut req = axum::http::Request::builder()
            .method(if body.is_some() { "POST" } else { "GET" })
            .uri(uri)
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json");
        req = req.header("host", "t");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let response =
            tower::ServiceExt::oneshot(app, req.body(axum::body::Body::from(body)).unwrap())
                .await
                .unwrap();
        let status = response.status().as_u16();
        let retry = response.headers().get("retry-after").is_some();
        (status, retry)
    };
    // A whole (non-streamed) generation holds the only slot while it runs.
    let long = tokio::spawn(call(
        app.clone(),
        "/v1/completions",
        Some(
            json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true}),
        ),
    ));
    let engine = state.chat[MODEL].engine.clone();
    let started = std::time::Instant::now();
    while engine.snapshot().active == 0 {
        assert!(
            started.elapsed().as_secs() < 30,
            "the generation never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (status, retry) = call(app.clone(), "/v1/models", None).await;
    assert_eq!(status, 503);
    assert!(retry, "Retry-After is set");
    // Probes and counters are not requests to refuse: a busy server is
    // alive and ready.
    for uri in ["/health/live", "/health/ready", "/health", "/metrics"] {
        assert_eq!(call(app.clone(), uri, None).await.0, 200, "{uri}");
    }
    assert_eq!(long.await.unwrap().0, 200);
    assert_eq!(call(app.clone(), "/v1/models", None).await.0, 200);
}

/// A body that cannot be read is told apart from one over the limit: one
/// cut short (or broken) is 400, one that stops arriving 408, and a
/// `Content-Length` over the limit is 413 before any of it is read; on the
/// inference routes (read whole before routing) and on the others alike.
#[tokio::test]
async fn unreadable_bodies_are_not_called_too_large() {
    use futures_util::StreamExt;
    let mut state = bare_state();
    state.http.body_timeout = Some(std::time::Duration::from_millis(200));
    let app = hearth_server::app(state);
    let send = |uri: &'static str, body: axum::body::Body, length: Option<u64>| {
        let app = app.clone();
        async move {
            let mut req = axum::http::Request::builder()
                .method("POST")
                .uri(uri)
                .header("authorization", format!("Bearer {KEY}"))
                .header("content-type", "application/json")
                .header("host", "t");
            if let Some(n) = length {
                req = req.header("content-length", n);
            }
            let response = tower::ServiceExt::oneshot(app, req.body(body).unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let broken = || {
        let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = vec![
            Ok(axum::body::Bytes::from_static(b"{\"model\"")),
            Err(std::io::Error::other("connection reset")),
        ];
        axum::body::Body::from_stream(futures_util::stream::iter(chunks))
    };
    let stalled = || {
        let first = futures_util::stream::once(async {
            Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{\"model\""))
        });
        axum::body::Body::from_stream(first.chain(futures_util::stream::pending()))
    };
    for uri in ["/v1/chat/completions", "/v1/fine_tuning/jobs"] {
        let (status, text) = send(uri, broken(), None).await;
        assert_eq!(status, 400, "{uri}: {text}");
        assert!(text.contains("could not be read"), "{uri}: {text}");
        let (status, text) = send(uri, stalled(), None).await;
        assert_eq!(status, 408, "{uri}: {text}");
        let (status, text) = send(uri, stalled(), Some(9 * 1024 * 1024)).await;
        assert_eq!(status, 413, "{uri}: {text}");
        assert!(text.contains("larger than the limit"), "{uri}: {text}");
    }
}
