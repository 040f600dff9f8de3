//! `/v1/batches` with the real default models: batches of every endpoint
//! run to completion through the batch worker, bad files fail with line
//! numbers, per-request errors land in the error file, cancel stops a run
//! with partial results, a stopped worker's batch resumes without losing or
//! repeating a line, and lists page and stay within their project.

mod common;

use std::time::{Duration, Instant};

use common::raw::*;
use common::*;
use hearth_server::config::BatchArgs;
use hearth_server::AppState;
use serde_json::{json, Value};

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The default models on a fresh store of its own.
fn state() -> AppState {
    let (store, project) = new_store();
    AppState {
        store,
        default_project: project.into(),
        batch_counters: Default::default(),
        endpoints: Default::default(),
        ..with_model()
    }
}

fn worker(state: &AppState, max_inflight: usize) -> hearth_jobs::BatchWorkerHandle {
    let args = BatchArgs {
        batch_workers: 1,
        batch_max_inflight: max_inflight,
        ..BatchArgs::default()
    };
    hearth_server::batch_endpoints::start_worker(state, &args).expect("a worker")
}

fn line(custom_id: &str, url: &str, body: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).to_string()
}

fn chat_body(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

async fn upload_batch_file(state: &AppState, lines: &[String]) -> String {
    let file = upload(state, "batch", (lines.join("\n") + "\n").as_bytes()).await;
    file["id"].as_str().unwrap().to_string()
}

async fn create(state: &AppState, body: Value) -> Raw {
    request(
        state,
        "POST",
        "/v1/batches",
        Some(KEY),
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

async fn create_ok(state: &AppState, file: &str, endpoint: &str) -> Value {
    let reply = create(
        state,
        json!({"input_file_id": file, "endpoint": endpoint, "completion_window": "24h",
               "metadata": {"purpose": "test"}}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let batch = reply.json();
    assert_eq!(batch["status"], "validating", "{batch}");
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["metadata"]["purpose"], "test");
    batch
}

/// A request without a body (cancel, delete).
async fn bodiless(state: &AppState, method: &str, uri: &str, key: &str) -> Raw {
    request(state, method, uri, Some(key), None, vec![]).await
}

async fn retrieve(state: &AppState, id: &str) -> Value {
    let reply = get(state, &format!("/v1/batches/{id}"), Some(KEY)).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    reply.json()
}

/// Polls the batch until `done(batch)` holds (panics after two minutes).
async fn wait_for(state: &AppState, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let batch = retrieve(state, id).await;
        if done(&batch) {
            return batch;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "batch stuck: {batch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_over(batch: &Value) -> bool {
    matches!(
        batch["status"].as_str(),
        Some("completed" | "failed" | "cancelled" | "expired")
    )
}

/// The JSON lines of a file.
async fn file_lines(state: &AppState, id: &Value) -> Vec<Value> {
    let id = id.as_str().expect("a file id");
    let reply = get(state, &format!("/v1/files/{id}/content"), Some(KEY)).await;
    assert_eq!(reply.status, 200);
    String::from_utf8(reply.bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_batch_completes_with_one_result_per_line() {
    let state = state();
    let worker = worker(&state, 4);
    let prompts = [
        "Say hi",
        "What is 2+2?",
        "Name a colour",
        "Count to three",
        "Say bye",
    ];
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| line(&format!("req-{i}"), "/v1/chat/completions", chat_body(p, 8)))
        .collect();
    let file = upload_batch_file(&state, &lines).await;
    let batch = create_ok(&state, &file, "/v1/chat/completions").await;
    let id = batch["id"].as_str().unwrap();
    let done = wait_for(&state, id, is_over).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": 5, "completed": 5, "failed": 0})
    );
    for field in [
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "output_file_id",
    ] {
        assert!(!done[field].is_null(), "{field}: {done}");
    }
    for field in ["error_file_id", "failed_at", "cancelled_at", "errors"] {
        assert!(done[field].is_null(), "{field}: {done}");
    }
    let out = file_lines(&state, &done["output_file_id"]).await;
    let ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["req-0", "req-1", "req-2", "req-3", "req-4"]);
    for l in &out {
        assert!(l["id"].as_str().unwrap().starts_with("batch_req_"), "{l}");
        assert!(l["error"].is_null());
        let response = &l["response"];
        assert_eq!(response["status_code"], 200);
        assert_eq!(response["body"]["object"], "chat.completion", "{l}");
        assert_eq!(response["request_id"], response["body"]["id"]);
        let text = response["body"]["choices"][0]["message"]["content"]
            .as_str()
            .unwrap();
        assert!(!text.is_empty(), "{l}");
    }
    // The same request over HTTP answers the same text (greedy): the batch
    // ran the route's code.
    let direct = post(
        &state,
        "/v1/chat/completions",
        &chat_body(prompts[1], 8).to_string(),
    )
    .await;
    assert_eq!(
        direct.json()["choices"][0]["message"]["content"],
        out[1]["response"]["body"]["choices"][0]["message"]["content"]
    );
    // The output is an ordinary file of the project.
    let files = get(&state, "/v1/files?purpose=batch_output", Some(KEY))
        .await
        .json();
    assert_eq!(files["data"][0]["id"], done["output_file_id"], "{files}");
    let metrics = get(&state, "/metrics", Some(KEY)).await;
    let metrics = String::from_utf8(metrics.bytes).unwrap();
    assert!(
        metrics.contains("hearth_batch_requests_total{outcome=\"completed\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hearth_batches{status=\"completed\"} 1"),
        "{metrics}"
    );
    worker.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_completions_and_responses_batches_complete() {
    let state = state();
    let worker = worker(&state, 4);
    let cases = [
        (
            "/v1/embeddings",
            json!({"model": EMBED, "input": "a sentence to embed"}),
            "list",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4}),
            "text_completion",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "Say hi", "max_output_tokens": 8}),
            "response",
        ),
    ];
    for (endpoint, body, object) in cases {
        let lines: Vec<String> = (0..3)
            .map(|i| line(&format!("c{i}"), endpoint, body.clone()))
            .collect();
        let file = upload_batch_file(&state, &lines).await;
        let batch = create_ok(&state, &file, endpoint).await;
        let done = wait_for(&state, batch["id"].as_str().unwrap(), is_over).await;
        assert_eq!(done["status"], "completed", "{endpoint}: {done}");
        assert_eq!(done["request_counts"]["completed"], 3, "{done}");
        let out = file_lines(&state, &done["output_file_id"]).await;
        assert_eq!(out.len(), 3);
        for l in &out {
            assert_eq!(l["response"]["body"]["object"], object, "{endpoint}: {l}");
        }
        if endpoint == "/v1/embeddings" {
            let vector = &out[0]["response"]["body"]["data"][0]["embedding"];
            assert_eq!(vector.as_array().unwrap().len(), 384);
        }
    }
    worker.shut_down().await;
}

/// A line whose result was not recorded (its node was killed mid-run) runs
/// again when the batch resumes; a `/v1/responses` line then replaces the
/// response its first run kept instead of keeping a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_line_run_again_keeps_one_response() {
    use hearth_jobs::batch::BatchEndpoints;
    let state = state();
    let endpoints = hearth_server::batch_endpoints::ServerEndpoints {
        state: state.clone(),
    };
    let project = state.default_project.to_string();
    let body =
        json!({"model": MODEL, "input": "Say hi", "max_output_tokens": 6, "temperature": 1.0});
    let body = body.as_object().unwrap().clone();
    let run = |key: &str| {
        endpoints.run(
            project.clone(),
            "/v1/responses".into(),
            body.clone(),
            key.into(),
        )
    };
    let first = run("batch_x:1").await;
    let again = run("batch_x:1").await;
    let other = run("batch_x:2").await;
    for reply in [&first, &again, &other] {
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let id = first.body["id"].as_str().unwrap();
    assert_eq!(again.body["id"], id, "a rerun names its response alike");
    assert_ne!(other.body["id"], id, "another line, another response");
    let kept = get(&state, &format!("/v1/responses/{id}"), Some(KEY)).await;
    assert_eq!(kept.status, 200);
    assert_eq!(
        kept.json(),
        again.body,
        "the rerun's response is the one kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_fail_the_batch_with_line_numbers() {
    let state = state();
    let worker = worker(&state, 4);
    let good = |id: &str| line(id, "/v1/chat/completions", chat_body("hi", 4));
    let cases: Vec<(Vec<String>, u64, &str)> = vec![
        (
            vec![good("a"), line("b", "/v1/embeddings", chat_body("hi", 4)), good("c")],
            2,
            "not the batch's endpoint",
        ),
        (
            vec![good("a"), good("b"), json!({"custom_id": "c", "method": "GET", "url": "/v1/chat/completions", "body": {}}).to_string()],
            3,
            "`method` must be `POST`",
        ),
        (vec![good("a"), good("a")], 2, "unique"),
        (
            vec![good("a"), line("b", "/v1/chat/completions", json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}))],
            2,
            "no-such-model",
        ),
        (
            vec![line("a", "/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9}))],
            1,
            "temperature",
        ),
        (
            vec![good("a"), line("b", "/v1/chat/completions", json!({"model": EMBED, "messages": [{"role": "user", "content": "x"}]}))],
            2,
            "not a chat model",
        ),
    ];
    // A line that is not JSON is caught at upload: creation names it.
    let file = upload_batch_file(&state, &[good("a"), good("b"), "{not json".into()]).await;
    let r = create(
        &state,
        json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 3"),
        "{}",
        r.json()
    );
    for (lines, bad_line, words) in cases {
        let file = upload_batch_file(&state, &lines).await;
        let batch = create_ok(&state, &file, "/v1/chat/completions").await;
        let done = wait_for(&state, batch["id"].as_str().unwrap(), is_over).await;
        assert_eq!(done["status"], "failed", "{done}");
        assert!(!done["failed_at"].is_null());
        assert!(
            done["output_file_id"].is_null() && done["in_progress_at"].is_null(),
            "{done}"
        );
        let errors = &done["errors"];
        assert_eq!(errors["object"], "list");
        let first = &errors["data"][0];
        assert_eq!(first["line"], bad_line, "{done}");
        let message = first["message"].as_str().unwrap();
        assert!(message.contains(words), "{words}: {message}");
        assert!(
            message.starts_with(&format!("Line {bad_line}:")),
            "{message}"
        );
    }
    worker.shut_down().await;
}

/// Lines that are not requests and requests their endpoint refuses are
/// reported together, in line order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_problem_is_reported_in_line_order() {
    let state = state();
    let worker = worker(&state, 4);
    let chat = "/v1/chat/completions";
    let messages = json!([{"role": "user", "content": "x"}]);
    let lines = vec![
        line("a", chat, chat_body("hi", 4)),
        line("b", chat, json!({"model": MODEL})),
        line("c", "/v1/embeddings", chat_body("hi", 4)),
        line("a", chat, chat_body("hi", 4)),
        json!({"method": "POST", "url": chat, "body": chat_body("hi", 4)}).to_string(),
        line(
            "f",
            chat,
            json!({"model": "no-such-model", "messages": messages}),
        ),
    ];
    let file = upload_batch_file(&state, &lines).await;
    let batch = create_ok(&state, &file, chat).await;
    let done = wait_for(&state, batch["id"].as_str().unwrap(), is_over).await;
    assert_eq!(done["status"], "failed", "{done}");
    let errors = done["errors"]["data"].as_array().unwrap();
    let at: Vec<u64> = errors.iter().map(|e| e["line"].as_u64().unwrap()).collect();
    assert_eq!(at, vec![2, 3, 4, 5, 6], "{done}");
    for (error, words) in errors.iter().zip([
        "messages",
        "endpoint",
        "unique",
        "custom_id",
        "no-such-model",
    ]) {
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(words), "{words}: {message}");
    }
    worker.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_go_to_the_error_file() {
    let state = state();
    let worker = worker(&state, 4);
    let lines = vec![
        line("ok", "/v1/chat/completions", chat_body("hi", 4)),
        // Passes the checks, but its max_tokens does not fit the context.
        line(
            "too-long",
            "/v1/chat/completions",
            chat_body("hi", 1_000_000),
        ),
    ];
    let file = upload_batch_file(&state, &lines).await;
    let batch = create_ok(&state, &file, "/v1/chat/completions").await;
    let done = wait_for(&state, batch["id"].as_str().unwrap(), is_over).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": 2, "completed": 1, "failed": 1})
    );
    let out = file_lines(&state, &done["output_file_id"]).await;
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["custom_id"], "ok");
    let errors = file_lines(&state, &done["error_file_id"]).await;
    assert_eq!(errors.len(), 1);
    let e = &errors[0];
    assert_eq!(e["custom_id"], "too-long");
    assert_eq!(e["response"]["status_code"], 400, "{e}");
    assert_eq!(e["error"]["code"], "invalid_request", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"),
        "{e}"
    );
    worker.shut_down().await;
}

fn long_batch(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            line(
                &format!("r{i}"),
                "/v1/chat/completions",
                json!({"model": MODEL, "messages": [{"role": "user", "content": format!("Tell a story about the number {i}.")}],
                       "max_tokens": 24, "temperature": 0, "ignore_eos": true}),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_batch_with_partial_results() {
    let state = state();
    let worker = worker(&state, 2);
    let file = upload_batch_file(&state, &long_batch(60)).await;
    let batch = create_ok(&state, &file, "/v1/chat/completions").await;
    let id = batch["id"].as_str().unwrap();
    wait_for(&state, id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(2)
    })
    .await;
    // The input file is in use while the batch runs.
    let delete = bodiless(&state, "DELETE", &format!("/v1/files/{file}"), KEY).await;
    assert_eq!(
        delete.status,
        409,
        "{}",
        String::from_utf8_lossy(&delete.bytes)
    );
    let reply = bodiless(&state, "POST", &format!("/v1/batches/{id}/cancel"), KEY).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let status = reply.json()["status"].as_str().unwrap().to_string();
    assert!(status == "cancelling" || status == "cancelled", "{status}");
    let done = wait_for(&state, id, is_over).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(
        !done["cancelling_at"].is_null() && !done["cancelled_at"].is_null(),
        "{done}"
    );
    let completed = done["request_counts"]["completed"].as_u64().unwrap();
    assert!((2..60).contains(&completed), "{done}");
    let out = file_lines(&state, &done["output_file_id"]).await;
    assert_eq!(out.len() as u64, completed);
    // Cancelling again returns it as it is; the file can go now.
    let again = bodiless(&state, "POST", &format!("/v1/batches/{id}/cancel"), KEY).await;
    assert_eq!(again.json()["status"], "cancelled");
    let delete = bodiless(&state, "DELETE", &format!("/v1/files/{file}"), KEY).await;
    assert_eq!(delete.status, 200);
    // The batch keeps its result file ids.
    assert_eq!(
        retrieve(&state, id).await["output_file_id"],
        done["output_file_id"]
    );
    worker.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_s_batch_resumes_without_losing_or_repeating_lines() {
    let state = state();
    let first = worker(&state, 1);
    let n = 16;
    let file = upload_batch_file(&state, &long_batch(n)).await;
    let batch = create_ok(&state, &file, "/v1/chat/completions").await;
    let id = batch["id"].as_str().unwrap();
    wait_for(&state, id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(3)
    })
    .await;
    first.shut_down().await;
    let paused = retrieve(&state, id).await;
    assert_eq!(paused["status"], "in_progress", "{paused}");
    let done_before = paused["request_counts"]["completed"].as_u64().unwrap();
    assert!(done_before < n as u64, "{paused}");
    let second = worker(&state, 4);
    let done = wait_for(&state, id, is_over).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": n, "completed": n, "failed": 0})
    );
    let out = file_lines(&state, &done["output_file_id"]).await;
    let ids: Vec<String> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    assert_eq!(ids, want, "exactly one result per line, in input order");
    second.shut_down().await;
}

#[tokio::test]
async fn creation_is_checked_and_lists_page_within_the_project() {
    let state = bare_state();
    let good = line("a", "/v1/embeddings", json!({"model": EMBED, "input": "x"}));
    let file = upload_batch_file(&state, &[good]).await;
    // Creation checks.
    let bad = |body: Value| {
        let state = state.clone();
        async move { create(&state, body).await }
    };
    let r =
        bad(json!({"input_file_id": file, "endpoint": "/v1/images", "completion_window": "24h"}))
            .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "endpoint");
    let r = bad(
        json!({"input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "7d"}),
    )
    .await;
    assert_eq!(r.json()["error"]["param"], "completion_window");
    let r = bad(json!({"input_file_id": "file-nope", "endpoint": "/v1/embeddings", "completion_window": "24h"})).await;
    assert_eq!(r.json()["error"]["param"], "input_file_id");
    let tune = upload(
        &state,
        "fine-tune",
        br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#,
    )
    .await;
    let r = bad(json!({"input_file_id": tune["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"})).await;
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("purpose"));
    let r = bad(json!({"endpoint": "/v1/embeddings", "completion_window": "24h"})).await;
    assert_eq!(r.status, 422);
    // Three batches (no worker: they stay `validating`), two on one file.
    let other_file = upload_batch_file(
        &state,
        &[line(
            "z",
            "/v1/embeddings",
            json!({"model": EMBED, "input": "y"}),
        )],
    )
    .await;
    let mut ids = Vec::new();
    for f in [&file, &other_file, &file] {
        ids.push(
            create_ok(&state, f, "/v1/embeddings").await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let page = get(&state, "/v1/batches?limit=2", Some(KEY)).await.json();
    assert_eq!(page["object"], "list");
    let listed: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[2].as_str(), ids[1].as_str()], "newest first");
    assert_eq!(
        (
            page["has_more"].as_bool(),
            page["first_id"].as_str(),
            page["last_id"].as_str()
        ),
        (Some(true), Some(ids[2].as_str()), Some(ids[1].as_str()))
    );
    let rest = get(
        &state,
        &format!("/v1/batches?limit=2&after={}", ids[1]),
        Some(KEY),
    )
    .await
    .json();
    assert_eq!(rest["data"][0]["id"], ids[0].as_str());
    assert_eq!(rest["has_more"], false);
    let by_file = get(
        &state,
        &format!("/v1/batches?input_file_id={file}"),
        Some(KEY),
    )
    .await
    .json();
    assert_eq!(by_file["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(&state, "/v1/batches?limit=0", Some(KEY)).await.status,
        422
    );
    // The input file of a waiting batch cannot be deleted.
    let delete = bodiless(&state, "DELETE", &format!("/v1/files/{file}"), KEY).await;
    assert_eq!(delete.status, 409);
    // Another project's key sees none of it: 403 exactly as a missing id.
    let (_other, other_key) = other_project(&state).await;
    let theirs = get(&state, "/v1/batches", Some(&other_key)).await.json();
    assert_eq!(theirs["data"], json!([]));
    let foreign = get(&state, &format!("/v1/batches/{}", ids[0]), Some(&other_key)).await;
    let missing = get(
        &state,
        "/v1/batches/batch-01JAAAAAAAAAAAAAAAAAAAAAAA",
        Some(&other_key),
    )
    .await;
    assert_eq!(shape_a(&foreign, 403), shape_a(&missing, 403));
    let cancel = bodiless(
        &state,
        "POST",
        &format!("/v1/batches/{}/cancel", ids[0]),
        &other_key,
    )
    .await;
    assert_eq!(cancel.status, 403);
    // A batch no worker holds is cancelled at once; cancelled is final.
    let cancelled = bodiless(
        &state,
        "POST",
        &format!("/v1/batches/{}/cancel", ids[0]),
        KEY,
    )
    .await;
    assert_eq!(cancelled.json()["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_its_window_expires_with_partial_results() {
    let state = state();
    let file = upload_batch_file(&state, &long_batch(40)).await;
    // Created already past its window (the API always gives 24 hours).
    let batch = state
        .store
        .create_batch(hearth_store::NewBatch {
            project_id: state.default_project.to_string(),
            endpoint: "/v1/chat/completions".into(),
            completion_window: "24h".into(),
            input_file_id: file,
            metadata: None,
            override_settings: None,
            expires_at: hearth_store::ids::now() - 1,
        })
        .await
        .unwrap();
    let worker = worker(&state, 1);
    let done = wait_for(&state, &batch.id, is_over).await;
    assert_eq!(done["status"], "expired", "{done}");
    assert!(!done["expired_at"].is_null(), "{done}");
    let completed = done["request_counts"]["completed"].as_u64().unwrap();
    assert!(completed < 40, "{done}");
    let expired = file_lines(&state, &done["error_file_id"]).await;
    assert_eq!(
        expired.len() as u64,
        40 - completed,
        "one error line per request not run"
    );
    assert!(expired
        .iter()
        .all(|l| l["error"]["code"] == "batch_expired" && l["response"].is_null()));
    if completed > 0 {
        assert_eq!(
            file_lines(&state, &done["output_file_id"]).await.len() as u64,
            completed
        );
    }
    worker.shut_down().await;
}
