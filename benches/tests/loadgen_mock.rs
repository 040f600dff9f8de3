//! The load generator against an in-process mock OpenAI-style SSE server:
//! token counts, usage preference, TTFT, concurrency, both routes, errors.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use hearth_benches::{run, Endpoint, LoadConfig, Target};
use serde_json::{json, Value};

/// How the mock streams.
#[derive(Clone, Copy)]
struct Mode {
    /// Send a final `usage` chunk.
    usage: bool,
    /// Content chunks per completion token (usage still says one per token).
    pieces_per_token: usize,
    /// Send an error event after this many tokens.
    fail_after: Option<usize>,
    /// Delay before the first chunk and between chunks.
    first_delay: Duration,
    gap: Duration,
}

#[derive(Clone)]
struct Mock {
    mode: Mode,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

async fn handler(
    State(mock): State<Mock>,
    headers: HeaderMap,
    chat: bool,
    Json(body): Json<Value>,
) -> Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer secret") {
        return (StatusCode::UNAUTHORIZED, r#"{"detail":"bad key"}"#).into_response();
    }
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    let prompt_words = if chat {
        body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count()
    } else {
        body["prompt"].as_str().unwrap().split_whitespace().count()
    };
    let max_tokens = body["max_tokens"].as_u64().unwrap() as usize;
    mock.requests.fetch_add(1, Ordering::SeqCst);
    let now = mock.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    mock.max_in_flight.fetch_max(now, Ordering::SeqCst);

    let mode = mock.mode;
    let piece = move |text: &str, finish: Option<&str>| -> Bytes {
        let choice = if chat {
            json!({"index": 0, "delta": {"content": text}, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "finish_reason": finish})
        };
        Bytes::from(format!("data: {}\n\n", json!({"choices": [choice]})))
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        tokio::time::sleep(mode.first_delay).await;
        // An empty chunk first (as servers send for the role): not a token.
        let _ = tx.send(Ok(piece("", None))).await;
        for t in 0..max_tokens {
            if mode.fail_after == Some(t) {
                let e = json!({"error": {"code": 500, "message": "engine stopped"}});
                let _ = tx.send(Ok(Bytes::from(format!("data: {e}\n\n")))).await;
                let _ = tx.send(Ok(Bytes::from("data: [DONE]\n\n"))).await;
                mock.in_flight.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            for _ in 0..mode.pieces_per_token {
                tokio::time::sleep(mode.gap).await;
                let _ = tx.send(Ok(piece("ab", None))).await;
            }
        }
        let _ = tx.send(Ok(piece("", Some("length")))).await;
        if mode.usage {
            let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_words,
                "completion_tokens": max_tokens, "total_tokens": prompt_words + max_tokens}});
            let _ = tx.send(Ok(Bytes::from(format!("data: {usage}\n\n")))).await;
        }
        let _ = tx.send(Ok(Bytes::from("data: [DONE]\n\n"))).await;
        mock.in_flight.fetch_sub(1, Ordering::SeqCst);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Starts the mock on a free port; returns its URL and its counters.
async fn serve(mode: Mode) -> (String, Mock) {
    let mock = Mock {
        mode,
        in_flight: Arc::default(),
        max_in_flight: Arc::default(),
        requests: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/completions", post(|s, h, b| handler(s, h, false, b)))
        .route(
            "/v1/chat/completions",
            post(|s, h, b| handler(s, h, true, b)),
        )
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, mock)
}

fn config(url: &str, endpoint: Endpoint) -> LoadConfig {
    LoadConfig {
        target: Target::parse(url).unwrap(),
        model: "mock".into(),
        endpoint,
        api_key: Some("secret".into()),
        concurrency: 3,
        requests: 6,
        max_tokens: 5,
        prompt_tokens: 100,
        ignore_eos: true,
        cache_bust: true,
        warmup: 1,
        timeout: Duration::from_secs(20),
        run_timeout: Duration::from_secs(60),
        label: "mock".into(),
        run_id: 1,
    }
}

const MODE: Mode = Mode {
    usage: true,
    pieces_per_token: 1,
    fail_after: None,
    first_delay: Duration::from_millis(40),
    gap: Duration::from_millis(10),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_usage_at_concurrency_3() {
    let (url, mock) = serve(Mode {
        pieces_per_token: 2,
        ..MODE
    })
    .await;
    let mut seen = 0;
    let s = run(Arc::new(config(&url, Endpoint::Completions)), |r| {
        assert!(r.idx >= 0, "warm-up results are not reported");
        seen += 1;
    })
    .await
    .unwrap();
    assert_eq!(seen, 6);
    assert_eq!((s.ok, s.failed), (6, 0));
    // usage (5 per request) wins over the 10 content chunks per request.
    assert_eq!(s.completion_tokens, 30);
    assert_eq!(s.tokens_from, "usage");
    assert_eq!(s.finish_reasons, vec!["length".to_string()]);
    // The mock's "prompt tokens" are the prompt's words: tag + the words.
    let words = 2 + hearth_benches::prompt::words_for(100);
    assert_eq!(s.prompt_tokens_mean, Some(words as f64));
    let ttft = s.ttft_p50_ms.unwrap();
    assert!((45.0..1000.0).contains(&ttft), "ttft {ttft}");
    let itl = s.itl_p50_ms.unwrap();
    assert!((8.0..500.0).contains(&itl), "itl {itl}");
    assert!(s.itl_p95_ms.unwrap() >= itl);
    assert!(s.ttft_p95_ms.unwrap() >= ttft);
    // 30 tokens over at least two rounds of ~150 ms each.
    let agg = s.agg_tok_s.unwrap();
    assert!(agg > 0.0 && agg < 150.0, "agg {agg}");
    // wall_s is rounded to the millisecond: 1% slack.
    assert!(
        (agg * s.wall_s / 30.0 - 1.0).abs() < 0.01,
        "agg {agg} wall {}",
        s.wall_s
    );
    assert_eq!(mock.requests.load(Ordering::SeqCst), 7); // + the warm-up
    assert_eq!(mock.max_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(s.first_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_usage_counts_content_chunks() {
    let (url, _mock) = serve(Mode {
        usage: false,
        ..MODE
    })
    .await;
    let mut cfg = config(&url, Endpoint::Chat);
    cfg.concurrency = 2;
    cfg.requests = 2;
    cfg.max_tokens = 7;
    let s = run(Arc::new(cfg), |_| {}).await.unwrap();
    assert_eq!((s.ok, s.completion_tokens), (2, 14));
    assert_eq!(s.tokens_from, "chunks");
    assert_eq!(s.prompt_tokens_mean, None);
    // 7 chunks, 10 ms apart: mean gap about 10 ms.
    let itl = s.itl_mean_ms.unwrap();
    assert!((8.0..200.0).contains(&itl), "itl {itl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_key_and_stream_errors_are_failures() {
    let (url, _mock) = serve(MODE).await;
    let mut cfg = config(&url, Endpoint::Completions);
    cfg.api_key = Some("wrong".into());
    cfg.warmup = 0;
    let s = run(Arc::new(cfg.clone()), |r| assert!(!r.ok))
        .await
        .unwrap();
    assert_eq!((s.ok, s.failed, s.completion_tokens), (0, 6, 0));
    assert_eq!(s.agg_tok_s, Some(0.0));
    assert!(s.first_error.unwrap().starts_with("HTTP 401"));

    // A warm-up failure stops the run.
    cfg.warmup = 1;
    let err = run(Arc::new(cfg), |_| {}).await.unwrap_err();
    assert!(err.to_string().contains("warmup failed"), "{err}");

    let (url, _mock) = serve(Mode {
        fail_after: Some(2),
        ..MODE
    })
    .await;
    let mut cfg = config(&url, Endpoint::Completions);
    cfg.warmup = 0;
    cfg.requests = 2;
    let s = run(Arc::new(cfg), |_| {}).await.unwrap();
    assert_eq!((s.ok, s.failed), (0, 2));
    assert!(s.first_error.unwrap().contains("engine stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_an_error_per_request() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut cfg = config(&url, Endpoint::Completions);
    cfg.warmup = 0;
    cfg.requests = 2;
    let s = run(Arc::new(cfg), |_| {}).await.unwrap();
    assert_eq!(s.failed, 2);
    assert!(s.first_error.unwrap().contains("connecting"));
}
