//! Usage metering, token quotas and budgets with the default models
//! (priced here, as a catalogue would price them): the sums of
//! `/v1/usage` equal the `usage` fields the responses returned; a quota
//! past its tokens answers 429 with a `Retry-After` that, once waited,
//! lets the next request through; a spent budget answers 402 to inference
//! and to new fine-tuning jobs until it is raised.

mod common;

use std::sync::Arc;

use common::raw::*;
use common::*;
use hearth_server::state::AppState;
use serde_json::{json, Value};

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// Per million tokens: 1000 (input) and 2000 (output), so one input token
/// costs 0.001 and one output token 0.002.
const PRICES: (f64, f64) = (1000.0, 2000.0);

/// The shared models, priced, over a fresh store and ledger.
fn priced_state() -> AppState {
    let mut state = with_model();
    let mut chat = (*state.chat).clone();
    for m in chat.values_mut() {
        m.entry.price_input_per_million = PRICES.0;
        m.entry.price_output_per_million = PRICES.1;
    }
    let mut embed = (*state.embed).clone();
    for m in embed.values_mut() {
        m.entry.price_input_per_million = PRICES.0;
    }
    state.chat = Arc::new(chat);
    state.embed = Arc::new(embed);
    let (store, project) = new_store();
    state.store = store;
    state.default_project = project.into();
    state.usage = Default::default();
    state
}

async fn send_as(state: &AppState, method: &str, key: &str, uri: &str, body: Value) -> Raw {
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

async fn post_as(state: &AppState, key: &str, uri: &str, body: Value) -> Raw {
    send_as(state, "POST", key, uri, body).await
}

async fn put_admin(state: &AppState, admin: &str, uri: &str, body: Value) -> Value {
    let reply = send_as(state, "PUT", admin, uri, body).await;
    reply.expect_status(200);
    reply.json()
}

fn chat(max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// (input, output) of a response's `usage`.
fn usage_of(body: &Value) -> (i64, i64) {
    let u = &body["usage"];
    let input = u["prompt_tokens"]
        .as_i64()
        .or_else(|| u["input_tokens"].as_i64())
        .unwrap();
    let output = u["completion_tokens"]
        .as_i64()
        .or_else(|| u["output_tokens"].as_i64())
        .unwrap_or(0);
    (input, output)
}

#[tokio::test]
async fn usage_sums_equal_what_the_responses_said() {
    let state = priced_state();
    let mut want = (0, 0);
    let mut requests = 0;
    let mut add = |body: &Value| {
        let (i, o) = usage_of(body);
        want.0 += i;
        want.1 += o;
        requests += 1;
    };
    let mut two = chat(6);
    two["n"] = json!(2);
    two["temperature"] = json!(0.8);
    for body in [chat(5), two] {
        let reply = post_as(&state, KEY, "/v1/chat/completions", body).await;
        assert_eq!(reply.status, 200);
        add(&reply.json());
    }
    let reply = post_as(
        &state,
        KEY,
        "/v1/completions",
        json!({"model": MODEL, "prompt": ["One", "Two three"], "max_tokens": 4}),
    )
    .await;
    add(&reply.json());
    let reply = post_as(
        &state,
        KEY,
        "/v1/responses",
        json!({"model": MODEL, "input": "Hi", "max_output_tokens": 16, "store": false}),
    )
    .await;
    reply.expect_status(200);
    add(&reply.json());
    let reply = post_as(
        &state,
        KEY,
        "/v1/embeddings",
        json!({"model": EMBED, "input": ["a cat", "a dog on a mat"]}),
    )
    .await;
    add(&reply.json());
    // Streamed, with the usage chunk.
    let mut streamed = chat(7);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let reply = post_as(&state, KEY, "/v1/chat/completions", streamed).await;
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    let last = sse_events(&text)
        .into_iter()
        .rfind(|e| e != "[DONE]")
        .unwrap();
    add(&serde_json::from_str(&last).unwrap());
    // A refused request is not counted.
    let bad = post_as(&state, KEY, "/v1/chat/completions", json!({"model": MODEL})).await;
    assert_eq!(bad.status, 422);

    let usage = get(&state, "/v1/usage", Some(KEY)).await;
    usage.expect_status(200);
    let usage = usage.json();
    let totals = &usage["totals"];
    assert_eq!(totals["input_tokens"], want.0, "{usage}");
    assert_eq!(totals["output_tokens"], want.1, "{usage}");
    assert_eq!(totals["requests"], requests, "{usage}");
    let cost = want.0 as f64 * 0.001 + want.1 as f64 * 0.002;
    assert!(
        (totals["cost"].as_f64().unwrap() - cost).abs() < 1e-9,
        "{usage}"
    );
    let models: Vec<_> = usage["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["model"].as_str().unwrap())
        .collect();
    assert!(
        models.contains(&MODEL) && models.contains(&EMBED),
        "{models:?}"
    );
    // Asking again counts nothing twice.
    let again = get(&state, "/v1/usage", Some(KEY)).await.json();
    assert_eq!(again["totals"], usage["totals"]);
    // Dates are checked.
    let bad = get(&state, "/v1/usage?start_date=2026-02-30", Some(KEY)).await;
    assert!(shape_b_message(&bad).contains("start_date"));
    // A start after today names itself, not an `end_date` nobody gave.
    let future = get(&state, "/v1/usage?start_date=2999-01-01", Some(KEY)).await;
    assert_eq!(future.json()["error"]["param"], "start_date");
    let reversed = "/v1/usage?start_date=2026-02-02&end_date=2026-02-01";
    assert_eq!(
        get(&state, reversed, Some(KEY)).await.json()["error"]["param"],
        "end_date"
    );
    // /metrics carries the same totals.
    let metrics = String::from_utf8(get(&state, "/metrics", Some(KEY)).await.bytes).unwrap();
    let line =
        format!("hearth_usage_output_tokens_total{{model=\"{MODEL}\",class=\"interactive\"}}");
    assert!(metrics.contains(&line), "{metrics}");
}

fn shape_b_message(reply: &Raw) -> String {
    reply.expect_status(400);
    reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_quota_answers_429_until_the_wait_it_names_is_over() {
    let state = priced_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let project = state.default_project.to_string();
    // A limit below 1 is 400 naming it; an unknown project's quotas 403.
    let uri = format!("/v1/admin/projects/{project}/quotas");
    for field in ["tokens_per_minute", "requests_per_minute", "burst_tokens"] {
        let body = json!({"model": "*", field: -5});
        let reply = send_as(&state, "PUT", &admin, &uri, body.clone()).await;
        assert!(!shape_b_param(&reply, Some(field)).is_empty(), "{body}");
    }
    // A burst bounds a token rate: alone (or with a request rate only) it
    // is refused, not taken as "no limits" (which removes the quota).
    for body in [
        json!({"model": "*", "burst_tokens": 100}),
        json!({"model": "*", "requests_per_minute": 5, "burst_tokens": 100}),
    ] {
        let reply = send_as(&state, "PUT", &admin, &uri, body.clone()).await;
        let message = shape_b_param(&reply, Some("burst_tokens"));
        assert!(message.contains("tokens_per_minute"), "{body}: {message}");
    }
    let unknown = "/v1/admin/projects/project-01JAAAAAAAAAAAAAAAAAAAAAAA/quotas";
    let reply = request(&state, "GET", unknown, Some(&admin), None, Vec::new()).await;
    shape_a(&reply, 403);
    // 10 tokens a second, 60 at once: a chat prompt here is about 35.
    put_admin(
        &state,
        &admin,
        &format!("/v1/admin/projects/{project}/quotas"),
        json!({"model": MODEL, "tokens_per_minute": 600, "burst_tokens": 60}),
    )
    .await;
    let mut refused = None;
    for _ in 0..10 {
        let reply = post_as(&state, KEY, "/v1/chat/completions", chat(8)).await;
        match reply.status {
            200 => continue,
            429 => {
                refused = Some(reply);
                break;
            }
            s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&reply.bytes)),
        }
    }
    let refused = refused.expect("the quota never refused a request");
    let detail = shape_a(&refused, 429);
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=6).contains(&wait), "{wait}");
    assert!(
        detail.contains(&format!("Retry after {wait} seconds")),
        "{detail}"
    );
    // Other models are not limited by this quota.
    let embed = post_as(
        &state,
        KEY,
        "/v1/embeddings",
        json!({"model": EMBED, "input": "x"}),
    )
    .await;
    assert_eq!(embed.status, 200);
    tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    let after = post_as(&state, KEY, "/v1/chat/completions", chat(8)).await;
    after.expect_status(200);
    // Removing the quota lifts it.
    put_admin(
        &state,
        &admin,
        &format!("/v1/admin/projects/{project}/quotas"),
        json!({"model": MODEL}),
    )
    .await;
    for _ in 0..3 {
        let reply = post_as(&state, KEY, "/v1/chat/completions", chat(8)).await;
        assert_eq!(reply.status, 200);
    }
}

#[tokio::test]
async fn a_spent_budget_answers_402_until_it_is_raised() {
    let state = priced_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let project = state.default_project.to_string();
    let uri = format!("/v1/admin/projects/{project}/budget");
    // Out of range: 400 naming the field, nothing set.
    for (body, param) in [
        (json!({"amount": -1}), "amount"),
        (json!({"amount": 5, "period": "week"}), "period"),
        (json!({"amount": 5, "currency": ""}), "currency"),
        (json!({"amount": 5, "currency": "usd"}), "currency"),
    ] {
        let reply = send_as(&state, "PUT", &admin, &uri, body.clone()).await;
        assert!(!shape_b_param(&reply, Some(param)).is_empty(), "{body}");
    }
    // A body without `amount` is 422 (it does not lift a budget).
    let missing = shape_c(&send_as(&state, "PUT", &admin, &uri, json!({"period": "total"})).await);
    assert_eq!(missing["type"], "missing", "{missing}");
    assert_eq!(missing["loc"], json!(["body", "amount"]));
    // 0.01: ten input tokens' worth, less than a request's prompt: refused
    // before it starts, saying what it may cost.
    let budget = put_admin(
        &state,
        &admin,
        &uri,
        json!({"amount": 0.01, "period": "month"}),
    )
    .await;
    assert_eq!(budget["exhausted"], false);
    let detail = shape_a(
        &post_as(&state, KEY, "/v1/chat/completions", chat(4)).await,
        402,
    );
    assert!(detail.contains("may cost up to"), "{detail}");
    // Room for one request; then less than the spent sum: exhausted.
    put_admin(
        &state,
        &admin,
        &uri,
        json!({"amount": 1, "period": "month"}),
    )
    .await;
    let first = post_as(&state, KEY, "/v1/chat/completions", chat(4)).await;
    assert_eq!(first.status, 200);
    put_admin(
        &state,
        &admin,
        &uri,
        json!({"amount": 0.01, "period": "month"}),
    )
    .await;
    let detail = shape_a(
        &post_as(&state, KEY, "/v1/chat/completions", chat(4)).await,
        402,
    );
    assert!(detail.contains("exhausted"), "{detail}");
    assert!(detail.contains("0.01 USD per month"), "{detail}");
    shape_a(
        &post_as(
            &state,
            KEY,
            "/v1/embeddings",
            json!({"model": EMBED, "input": "x"}),
        )
        .await,
        402,
    );
    let job = post_as(
        &state,
        KEY,
        "/v1/fine_tuning/jobs",
        json!({"model": MODEL, "training_file": "file-x"}),
    )
    .await;
    shape_a(&job, 402);
    let shown = request(&state, "GET", &uri, Some(&admin), None, Vec::new())
        .await
        .json();
    assert_eq!(shown["exhausted"], true, "{shown}");
    let (i, o) = usage_of(&first.json());
    let spent = i as f64 * 0.001 + o as f64 * 0.002;
    assert!(
        (shown["spent"].as_f64().unwrap() - spent).abs() < 1e-9,
        "{shown}"
    );
    // Only admins set budgets.
    let not_admin = request(
        &state,
        "PUT",
        &uri,
        Some(KEY),
        Some("application/json"),
        b"{\"amount\": 100}".to_vec(),
    )
    .await;
    shape_a(&not_admin, 403);
    put_admin(&state, &admin, &uri, json!({"amount": 100})).await;
    let again = post_as(&state, KEY, "/v1/chat/completions", chat(4)).await;
    assert_eq!(again.status, 200);
}

/// With two alive nodes sharing the store, each enforces half of a quota:
/// a 4-requests-a-minute quota admits 2 requests on this node.
#[tokio::test]
async fn a_quota_is_shared_between_the_alive_nodes() {
    let state = priced_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let project = state.default_project.to_string();
    put_admin(
        &state,
        &admin,
        &format!("/v1/admin/projects/{project}/quotas"),
        json!({"model": MODEL, "requests_per_minute": 4}),
    )
    .await;
    state.usage.set_alive_nodes(2);
    let mut replies = Vec::new();
    for _ in 0..3 {
        replies.push(post_as(&state, KEY, "/v1/chat/completions", chat(1)).await);
    }
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    // The refusal names the quota that refused: requests, not tokens.
    let detail = replies[2].json()["detail"].as_str().unwrap().to_string();
    assert!(
        detail.starts_with(&format!("Request quota exceeded for model `{MODEL}`.")),
        "{detail}"
    );
}

#[tokio::test]
async fn concurrent_requests_are_admitted_against_each_others_holds() {
    let state = priced_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let project = state.default_project.to_string();
    let uri = format!("/v1/admin/projects/{project}/budget");
    let mut body = chat(32);
    body["ignore_eos"] = json!(true);
    // One request before any budget: what each one costs.
    let first = post_as(&state, KEY, "/v1/chat/completions", body.clone()).await;
    first.expect_status(200);
    let (prompt, output) = usage_of(&first.json());
    assert_eq!(output, 32);
    let cost = prompt as f64 * 0.001 + output as f64 * 0.002;
    // Room for two and a half more: each request holds its prompt and its
    // `max_tokens` of output from admission and is admitted only when that
    // fits what is left, so exactly two of ten sent at once get in
    // (charging prompts alone had let eight in).
    let amount = cost * 3.5;
    put_admin(
        &state,
        &admin,
        &uri,
        json!({"amount": amount, "period": "total"}),
    )
    .await;
    let sent: Vec<_> = (0..10)
        .map(|_| {
            let (state, body) = (state.clone(), body.clone());
            tokio::spawn(async move { post_as(&state, KEY, "/v1/chat/completions", body).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for reply in sent {
        statuses.push(reply.await.unwrap().status);
    }
    statuses.sort();
    assert_eq!(statuses, [&[200; 2][..], &[402; 8][..]].concat());
    let shown = request(&state, "GET", &uri, Some(&admin), None, Vec::new())
        .await
        .json();
    let spent = shown["spent"].as_f64().unwrap();
    assert!((spent - 3.0 * cost).abs() < 1e-6, "{shown} {cost}");
    // Half a request's room left: one that may cost more is refused, saying
    // why.
    let over = post_as(&state, KEY, "/v1/chat/completions", chat(2000)).await;
    let detail = shape_a(&over, 402);
    assert!(detail.contains("`max_tokens`"), "{detail}");
    // What a hold did not use goes back when its request ends: after a
    // request that holds 100 output tokens and ends early, the next such
    // request still finds room (it would not beside the first one's hold).
    put_admin(
        &state,
        &admin,
        &uri,
        json!({"amount": 7.0 * cost, "period": "total"}),
    )
    .await;
    let early = post_as(&state, KEY, "/v1/chat/completions", chat(100)).await;
    early.expect_status(200);
    assert!(usage_of(&early.json()).1 < 50, "{}", early.json());
    post_as(&state, KEY, "/v1/chat/completions", chat(100))
        .await
        .expect_status(200);
}
