//! Driving many streamed requests and summing them up.
//!
//! [`run`] sends `warmup` untimed requests one after the other, then
//! `requests` requests from `concurrency` workers (each sends its next request
//! when the previous one has ended). Per request it records the time to the
//! first non-empty content chunk (TTFT), the gaps between content chunks and
//! the token count: `usage.completion_tokens` when the server sends usage
//! (it is asked to, with `stream_options.include_usage`), else one token per
//! non-empty content chunk.
//!
//! The summary's fields match those of the Python reference script
//! (`agg_tok_s`, `ttft_p50_ms`, `itl_mean_ms`, ...), so the two can be run
//! against the same server and compared; `itl_p50_ms`/`itl_p95_ms` (over all
//! gaps between content chunks of all streams) and `prompt_tokens_mean` are
//! extra.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

pub use crate::client::Target;
use crate::client::{next_data, post_stream, read_prefix};
use crate::prompt::prompt;
use crate::sse::{read_chunk, SseEvent, SseParser};
use crate::stats::{mean, percentile, round};

/// Which OpenAI route to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/completions` with `prompt`.
    Completions,
    /// `POST /v1/chat/completions` with one user message.
    Chat,
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub target: Target,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    pub concurrency: usize,
    pub requests: usize,
    pub max_tokens: usize,
    /// Approximate prompt length in tokens.
    pub prompt_tokens: usize,
    /// Sends `ignore_eos: true` (every request then runs to `max_tokens`).
    pub ignore_eos: bool,
    /// Starts each prompt with a tag unique to the request and run.
    pub cache_bust: bool,
    pub warmup: usize,
    /// Per-request limit.
    pub timeout: Duration,
    /// No request is started after this much time.
    pub run_timeout: Duration,
    /// Free text copied into the summary.
    pub label: String,
    /// Makes the cache-bust tags unique to this run.
    pub run_id: u64,
}

/// The outcome of one request.
#[derive(Debug, Clone, Default)]
pub struct RequestResult {
    /// Negative for warm-up requests.
    pub idx: i64,
    pub ok: bool,
    /// Completion tokens: usage when sent, else content chunks.
    pub tokens: u64,
    /// Non-empty content chunks.
    pub chunks: u64,
    pub usage_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// Since the request started: first and last content chunk.
    pub first: Option<Duration>,
    pub last: Option<Duration>,
    /// Milliseconds between consecutive content chunks.
    pub gaps_ms: Vec<f64>,
    pub finish_reason: Option<String>,
    pub timings: Option<Value>,
    pub error: Option<String>,
    /// Whole request, connection included.
    pub latency: Duration,
    /// When it ended.
    pub end: Option<Instant>,
}

impl RequestResult {
    /// TTFT in milliseconds.
    pub fn ttft_ms(&self) -> Option<f64> {
        self.first.map(|d| d.as_secs_f64() * 1e3)
    }

    /// Mean gap between content chunks of this stream, ms (as the Python
    /// script computes it: first to last chunk over chunks - 1).
    pub fn itl_ms(&self) -> Option<f64> {
        match (self.first, self.last) {
            (Some(f), Some(l)) if self.chunks > 1 && l > f => {
                Some((l - f).as_secs_f64() * 1e3 / (self.chunks - 1) as f64)
            }
            _ => None,
        }
    }
}

/// The route and JSON body of request `idx`.
pub fn request_body(cfg: &LoadConfig, idx: i64) -> (&'static str, Value) {
    let tag = cfg.run_id.to_string();
    let text = prompt(
        idx,
        cfg.prompt_tokens,
        cfg.cache_bust.then_some(tag.as_str()),
    );
    let mut body = json!({
        "model": cfg.model,
        "stream": true,
        "max_tokens": cfg.max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": true},
    });
    if cfg.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    match cfg.endpoint {
        Endpoint::Completions => {
            body["prompt"] = json!(text);
            ("/v1/completions", body)
        }
        Endpoint::Chat => {
            body["messages"] = json!([{"role": "user", "content": text}]);
            ("/v1/chat/completions", body)
        }
    }
}

/// Sends request `idx` and reads its stream to the end.
pub async fn one_request(cfg: &LoadConfig, idx: i64) -> RequestResult {
    let start = Instant::now();
    let mut res = RequestResult {
        idx,
        ..Default::default()
    };
    let outcome = tokio::time::timeout(cfg.timeout, drive(cfg, idx, start, &mut res)).await;
    match outcome {
        Err(_) => res.error = Some("request timeout".into()),
        Ok(Err(e)) => res.error = Some(format!("{e:#}")),
        Ok(Ok(())) => {}
    }
    res.latency = start.elapsed();
    res.end = Some(Instant::now());
    res.tokens = res.usage_tokens.unwrap_or(res.chunks);
    res.ok = res.error.is_none() && res.tokens > 0;
    if !res.ok && res.error.is_none() {
        res.error = Some("no tokens received".into());
    }
    res
}

async fn drive(
    cfg: &LoadConfig,
    idx: i64,
    start: Instant,
    res: &mut RequestResult,
) -> anyhow::Result<()> {
    let (path, body) = request_body(cfg, idx);
    let response = post_stream(
        &cfg.target,
        path,
        cfg.api_key.as_deref(),
        serde_json::to_vec(&body)?,
    )
    .await?;
    let status = response.status();
    let mut body = response.into_body();
    if status != hyper::StatusCode::OK {
        anyhow::bail!(
            "HTTP {}: {}",
            status.as_u16(),
            read_prefix(&mut body, 300).await
        );
    }
    let mut parser = SseParser::new();
    while let Some(piece) = next_data(&mut body).await {
        let piece = piece?;
        let now = start.elapsed();
        for event in parser.push(&piece) {
            if handle(cfg, event, now, res)? {
                return Ok(());
            }
        }
    }
    if let Some(event) = parser.finish() {
        handle(cfg, event, start.elapsed(), res)?;
    }
    Ok(())
}

/// Applies one event; `true` once `[DONE]` is seen.
fn handle(
    cfg: &LoadConfig,
    event: SseEvent,
    now: Duration,
    res: &mut RequestResult,
) -> anyhow::Result<bool> {
    let data = match event {
        SseEvent::Done => return Ok(true),
        SseEvent::Data(d) => d,
    };
    let Some(chunk) = read_chunk(&data, cfg.endpoint) else {
        return Ok(false);
    };
    if let Some(e) = chunk.error {
        anyhow::bail!("stream error: {e}");
    }
    for _ in 0..chunk.content_pieces {
        if let Some(last) = res.last {
            res.gaps_ms.push((now - last).as_secs_f64() * 1e3);
        }
        res.first.get_or_insert(now);
        res.last = Some(now);
        res.chunks += 1;
    }
    if chunk.finish_reason.is_some() {
        res.finish_reason = chunk.finish_reason;
    }
    if let Some(u) = chunk.usage {
        res.usage_tokens = u.completion_tokens.or(res.usage_tokens);
        res.prompt_tokens = u.prompt_tokens.or(res.prompt_tokens);
    }
    if chunk.timings.is_some() {
        res.timings = chunk.timings;
    }
    Ok(false)
}

/// The numbers of a run (field names as in the Python reference script).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub label: String,
    pub endpoint: Endpoint,
    pub concurrency: usize,
    pub requests: usize,
    pub ok: usize,
    pub failed: usize,
    pub max_tokens: usize,
    pub completion_tokens: u64,
    pub wall_s: f64,
    /// Completion tokens of the ok requests over the wall time of the run.
    pub agg_tok_s: Option<f64>,
    pub ttft_mean_ms: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    /// Mean over streams of each stream's mean gap between content chunks.
    pub itl_mean_ms: Option<f64>,
    /// Over all gaps between content chunks of all ok streams.
    pub itl_p50_ms: Option<f64>,
    pub itl_p95_ms: Option<f64>,
    /// Mean over streams of 1000 / that stream's mean gap.
    pub stream_tok_s: Option<f64>,
    pub latency_mean_s: Option<f64>,
    pub prompt_tokens_mean: Option<f64>,
    pub finish_reasons: Vec<String>,
    /// `usage` when every ok request reported usage, else `chunks`.
    pub tokens_from: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_prompt_tok_s_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_decode_tok_s_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Sums up the results of a run that took `wall` (first request sent to last
/// one ended) out of `requests` planned.
pub fn summarize(cfg: &LoadConfig, results: &[RequestResult], wall: Duration) -> Summary {
    let ok: Vec<&RequestResult> = results.iter().filter(|r| r.ok).collect();
    let tokens: u64 = ok.iter().map(|r| r.tokens).sum();
    let wall_s = wall.as_secs_f64();
    let ttfts: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms()).collect();
    let itls: Vec<f64> = ok.iter().filter_map(|r| r.itl_ms()).collect();
    let gaps: Vec<f64> = ok.iter().flat_map(|r| r.gaps_ms.iter().copied()).collect();
    let prompts: Vec<f64> = ok
        .iter()
        .filter_map(|r| r.prompt_tokens.map(|p| p as f64))
        .collect();
    let timing = |key: &str| -> Vec<f64> {
        ok.iter()
            .filter_map(|r| r.timings.as_ref()?.get(key)?.as_f64())
            .filter(|x| *x > 0.0)
            .collect()
    };
    let r = |x: Option<f64>, d: i32| x.map(|v| round(v, d));
    let mut finish: Vec<String> = ok
        .iter()
        .map(|r| r.finish_reason.clone().unwrap_or_else(|| "None".into()))
        .collect();
    finish.sort();
    finish.dedup();
    Summary {
        label: cfg.label.clone(),
        endpoint: cfg.endpoint,
        concurrency: cfg.concurrency,
        requests: cfg.requests,
        ok: ok.len(),
        failed: cfg.requests.saturating_sub(ok.len()),
        max_tokens: cfg.max_tokens,
        completion_tokens: tokens,
        wall_s: round(wall_s, 3),
        agg_tok_s: (wall_s > 0.0).then(|| round(tokens as f64 / wall_s, 2)),
        ttft_mean_ms: r(mean(&ttfts), 1),
        ttft_p50_ms: r(percentile(&ttfts, 50.0), 1),
        ttft_p95_ms: r(percentile(&ttfts, 95.0), 1),
        itl_mean_ms: r(mean(&itls), 2),
        itl_p50_ms: r(percentile(&gaps, 50.0), 2),
        itl_p95_ms: r(percentile(&gaps, 95.0), 2),
        stream_tok_s: r(
            mean(&itls.iter().map(|x| 1000.0 / x).collect::<Vec<_>>()),
            2,
        ),
        latency_mean_s: r(
            mean(
                &ok.iter()
                    .map(|r| r.latency.as_secs_f64())
                    .collect::<Vec<_>>(),
            ),
            3,
        ),
        prompt_tokens_mean: r(mean(&prompts), 1),
        finish_reasons: finish,
        tokens_from: if !ok.is_empty() && ok.iter().all(|r| r.usage_tokens.is_some()) {
            "usage"
        } else {
            "chunks"
        },
        server_prompt_tok_s_mean: r(mean(&timing("prompt_per_second")), 1),
        server_decode_tok_s_mean: r(mean(&timing("predicted_per_second")), 1),
        first_error: results.iter().find_map(|r| r.error.clone()),
    }
}

/// Runs the warm-up, then the timed requests; calls `on_result` as each
/// timed request ends. Fails only when a warm-up request fails.
pub async fn run(
    cfg: Arc<LoadConfig>,
    mut on_result: impl FnMut(&RequestResult),
) -> anyhow::Result<Summary> {
    for w in 0..cfg.warmup {
        let r = one_request(&cfg, -1 - w as i64).await;
        if !r.ok {
            anyhow::bail!("warmup failed: {}", r.error.unwrap_or_default());
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let deadline = start + cfg.run_timeout;
    for _ in 0..cfg.concurrency.max(1) {
        let (cfg, next, tx) = (cfg.clone(), next.clone(), tx.clone());
        tokio::spawn(async move {
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cfg.requests {
                    break;
                }
                let r = one_request(&cfg, i as i64).await;
                if tx.send(r).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut results = Vec::with_capacity(cfg.requests);
    while let Some(r) = rx.recv().await {
        on_result(&r);
        results.push(r);
    }
    let end = results
        .iter()
        .filter_map(|r| r.end)
        .max()
        .unwrap_or_else(Instant::now);
    Ok(summarize(
        &cfg,
        &results,
        end.saturating_duration_since(start),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LoadConfig {
        LoadConfig {
            target: Target::parse("http://127.0.0.1:1").unwrap(),
            model: "m".into(),
            endpoint: Endpoint::Completions,
            api_key: None,
            concurrency: 2,
            requests: 3,
            max_tokens: 4,
            prompt_tokens: 100,
            ignore_eos: true,
            cache_bust: true,
            warmup: 0,
            timeout: Duration::from_secs(5),
            run_timeout: Duration::from_secs(5),
            label: "x".into(),
            run_id: 7,
        }
    }

    fn result(ok: bool, tokens: u64, first_ms: u64, last_ms: u64) -> RequestResult {
        RequestResult {
            ok,
            tokens,
            chunks: tokens,
            usage_tokens: Some(tokens),
            first: Some(Duration::from_millis(first_ms)),
            last: Some(Duration::from_millis(last_ms)),
            gaps_ms: vec![(last_ms - first_ms) as f64 / (tokens - 1) as f64; tokens as usize - 1],
            finish_reason: Some("length".into()),
            error: (!ok).then(|| "HTTP 500: x".to_string()),
            latency: Duration::from_millis(last_ms + 1),
            ..Default::default()
        }
    }

    #[test]
    fn bodies_for_both_routes() {
        let mut c = cfg();
        let (path, body) = request_body(&c, 2);
        assert_eq!(path, "/v1/completions");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["ignore_eos"], true);
        assert!(body["prompt"].as_str().unwrap().starts_with("Request 2/7."));
        c.endpoint = Endpoint::Chat;
        c.ignore_eos = false;
        c.cache_bust = false;
        let (path, body) = request_body(&c, 2);
        assert_eq!(path, "/v1/chat/completions");
        assert!(body.get("ignore_eos").is_none());
        assert_eq!(body["messages"][0]["role"], "user");
        assert!(!body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Request"));
    }

    #[test]
    fn summary_counts_only_ok_requests() {
        let results = vec![
            result(true, 5, 100, 140),   // itl 10 ms
            result(true, 3, 300, 340),   // itl 20 ms
            result(false, 2, 900, 1000), // failed: ignored
        ];
        let s = summarize(&cfg(), &results, Duration::from_secs(2));
        assert_eq!((s.ok, s.failed, s.completion_tokens), (2, 1, 8));
        assert_eq!(s.agg_tok_s, Some(4.0));
        assert_eq!(s.ttft_p50_ms, Some(200.0));
        assert_eq!(s.ttft_mean_ms, Some(200.0));
        assert_eq!(s.itl_mean_ms, Some(15.0));
        assert_eq!(s.stream_tok_s, Some(75.0)); // mean of 100 and 50
                                                // gaps: four of 10 ms and two of 20 ms
        assert_eq!(s.itl_p50_ms, Some(10.0));
        assert_eq!(s.itl_p95_ms, Some(20.0));
        assert_eq!(s.tokens_from, "usage");
        assert_eq!(s.finish_reasons, vec!["length".to_string()]);
        assert_eq!(s.first_error.as_deref(), Some("HTTP 500: x"));
    }
}
