//! `hearth-loadgen`: streamed-request load against an OpenAI-compatible
//! server; prints aggregate completion tok/s, TTFT and inter-token latency
//! percentiles, request and error counts.
//!
//! ```sh
//! hearth-loadgen --url http://127.0.0.1:8000 --api-key KEY \
//!   --model HuggingFaceTB/SmolLM2-135M-Instruct --concurrency 4 --json
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use hearth_benches::{run, Endpoint, LoadConfig, RequestResult, Summary, Target};

#[derive(Parser, Debug)]
#[command(name = "hearth-loadgen", version, about)]
struct Args {
    /// Base URL of the server (`/v1/...` is appended).
    #[arg(long, alias = "base-url", default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Bearer key, if the server wants one.
    #[arg(long, env = "HEARTH_API_KEY", default_value = "")]
    api_key: String,
    #[arg(long, default_value = "default")]
    model: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Timed requests in all (default: max(4, 2 x concurrency)).
    #[arg(long)]
    requests: Option<usize>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Approximate prompt length in tokens (varied words per request).
    #[arg(long, default_value_t = 100)]
    prompt_tokens: usize,
    #[arg(long, value_enum, default_value = "completions")]
    endpoint: Endpoint,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// No new request is started after this many seconds.
    #[arg(long, default_value_t = 900.0)]
    run_timeout: f64,
    /// Do not send `ignore_eos: true`.
    #[arg(long = "no-ignore-eos")]
    no_ignore_eos: bool,
    /// Send prompts without the per-request tag (lets prefix caches hit).
    #[arg(long = "no-cache-bust")]
    no_cache_bust: bool,
    /// Untimed requests sent first, one after the other.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Free text copied into the summary.
    #[arg(long, default_value = "")]
    label: String,
    /// Print one JSON summary line on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Print one line per request on stderr.
    #[arg(long, short)]
    verbose: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64 % 1_000_000);
    let cfg = LoadConfig {
        target: Target::parse(&args.url)?,
        model: args.model,
        endpoint: args.endpoint,
        api_key: (!args.api_key.is_empty()).then_some(args.api_key),
        concurrency: args.concurrency.max(1),
        requests: args
            .requests
            .unwrap_or_else(|| (2 * args.concurrency).max(4)),
        max_tokens: args.max_tokens,
        prompt_tokens: args.prompt_tokens,
        ignore_eos: !args.no_ignore_eos,
        cache_bust: !args.no_cache_bust,
        warmup: args.warmup,
        timeout: Duration::from_secs_f64(args.timeout),
        run_timeout: Duration::from_secs_f64(args.run_timeout),
        label: args.label,
        run_id,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let verbose = args.verbose;
    let summary = runtime.block_on(run(Arc::new(cfg), |r: &RequestResult| {
        if verbose {
            eprintln!(
                "req {}: ok={} tokens={} ttft_ms={:?} lat={:.3} err={:?}",
                r.idx,
                r.ok,
                r.tokens,
                r.ttft_ms().map(|t| (t * 10.0).round() / 10.0),
                r.latency.as_secs_f64(),
                r.error
            );
        }
    }))?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_table(&summary);
    }
    if summary.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn print_table(s: &Summary) {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v}"));
    println!(
        "{} requests ({} ok, {} failed), concurrency {}, {} max tokens, {:?}",
        s.requests, s.ok, s.failed, s.concurrency, s.max_tokens, s.endpoint
    );
    println!(
        "completion tokens   {} in {} s (from {})",
        s.completion_tokens, s.wall_s, s.tokens_from
    );
    println!("aggregate tok/s     {}", f(s.agg_tok_s));
    println!(
        "TTFT ms             p50 {}  p95 {}  mean {}",
        f(s.ttft_p50_ms),
        f(s.ttft_p95_ms),
        f(s.ttft_mean_ms)
    );
    println!(
        "inter-token ms      p50 {}  p95 {}  mean {}",
        f(s.itl_p50_ms),
        f(s.itl_p95_ms),
        f(s.itl_mean_ms)
    );
    println!("per-stream tok/s    {}", f(s.stream_tok_s));
    println!("prompt tokens mean  {}", f(s.prompt_tokens_mean));
    if let Some(e) = &s.first_error {
        println!("first error         {e}");
    }
}
