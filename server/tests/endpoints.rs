//! `/v0/dedicated_endpoints` with the real default model: templates,
//! creation from the first template, serving by routing key on the
//! endpoint's own engine, updates, deletion, admission control, projects
//! and a restart.

mod common;

use std::time::{Duration, Instant};

use common::raw::{call, other_project, shape_b_param, shape_c, text, Raw};
use common::*;
use hearth_server::endpoints::reconcile;
use hearth_server::endpoints::{Capacity, Endpoints};
use hearth_server::AppState;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// The default model on a fresh store, with a registry of its own whose
/// node sets aside `memory_mb` and two threads of two cores.
fn state_with(memory_mb: u64) -> AppState {
    let base = with_model();
    let mut host = base.endpoints.host().expect("a host").clone();
    host.capacity = Capacity {
        memory: memory_mb * MIB,
        threads: 2,
        cores: 2,
        gpu: None,
    };
    host.scale_down_after = Duration::ZERO;
    host.drain_deadline = Duration::from_secs(1);
    let (store, project) = new_store();
    AppState {
        store,
        default_project: project.into(),
        endpoints: Endpoints::new(host),
        ..base
    }
}

/// A state on the same store as `state`, as after a restart: a new
/// registry, nothing loaded.
fn restarted(state: &AppState) -> AppState {
    let host = state.endpoints.host().unwrap().clone();
    AppState {
        endpoints: Endpoints::new(host),
        ..state.clone()
    }
}

async fn templates(state: &AppState) -> Vec<Value> {
    let reply = call(state, "GET", "/v0/dedicated_endpoints/templates", KEY, None).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    reply.json()["templates"].as_array().unwrap().clone()
}

async fn list(state: &AppState, key: &str) -> Vec<Value> {
    let reply = call(state, "GET", "/v0/dedicated_endpoints", key, None).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(reply.json()["object"], "list");
    reply.json()["data"].as_array().unwrap().clone()
}

/// Waits (running passes of the reconciler) until the endpoint's status is
/// `want`; returns the endpoint.
async fn wait_for(state: &AppState, id: &str, want: &str) -> Value {
    let start = Instant::now();
    loop {
        reconcile::reconcile_once(state).await;
        let found = list(state, KEY)
            .await
            .into_iter()
            .find(|e| e["endpoint_id"] == id);
        if let Some(e) = &found {
            if e["status"] == want {
                return e.clone();
            }
            assert_ne!(e["status"], "failed", "{e}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "endpoint {id} never became {want}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn chat(state: &AppState, key: &str, model: &str) -> Raw {
    call(
        state,
        "POST",
        "/v1/chat/completions",
        key,
        Some(json!({
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8,
            "temperature": 0,
        })),
    )
    .await
}

/// The value of a `/metrics` series line starting with `prefix`.
async fn metric(state: &AppState, prefix: &str) -> f64 {
    let reply = call(state, "GET", "/metrics", KEY, None).await;
    let body = text(&reply);
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in /metrics:\n{body}"))
}

/// `POST /v0/dedicated_endpoints` with `body`: 201 expected; the endpoint.
async fn create(state: &AppState, body: Value) -> Value {
    let reply = call(state, "POST", "/v0/dedicated_endpoints", KEY, Some(body)).await;
    assert_eq!(reply.status, 201, "{}", text(&reply));
    reply.json()
}

/// A creation body made from a template exactly as it is listed.
fn body_from(template: &Value, flavor: &Value, name: &str) -> Value {
    json!({
        "name": name,
        "model_name": template["model_name"],
        "flavor_name": flavor["flavor_name"],
        "gpu_type": flavor["gpu_type"],
        "gpu_count": flavor["gpu_count"],
        "region": flavor["regions"][0],
        "scaling": {"min_replicas": 1, "max_replicas": 1},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_offer_the_served_model_with_the_flavors_that_fit() {
    let state = state_with(4096);
    let all = templates(&state).await;
    let t = all
        .iter()
        .find(|t| t["model_name"] == MODEL)
        .unwrap_or_else(|| panic!("{all:?}"));
    assert!(t["context_length"].as_u64().unwrap() > 0, "{t}");
    let flavors = t["flavors"].as_array().unwrap();
    let names: Vec<&str> = flavors
        .iter()
        .map(|f| f["flavor_name"].as_str().unwrap())
        .collect();
    // Two cores: one flavor of one thread, one of two.
    assert_eq!(names, ["cpu-medium", "cpu-large"], "{t}");
    for f in flavors {
        assert_eq!(f["gpu_type"], "cpu");
        assert_eq!(f["gpu_count"], 0);
        assert_eq!(f["regions"], json!(["local"]));
        let r = &f["resources"];
        // Weights (about 90 MB), the KV cache and working memory.
        assert!(
            r["memory_mb"].as_u64().unwrap() > r["kv_cache_mb"].as_u64().unwrap() + 64,
            "{f}"
        );
        assert!(r["max_active"].as_u64().unwrap() >= 8, "{f}");
    }
    // A node with too little memory offers no flavor, hence no template.
    let small = state_with(200);
    assert!(templates(&small)
        .await
        .iter()
        .all(|t| t["model_name"] != MODEL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_serves_on_its_own_engine_survives_a_restart_and_is_deleted() {
    let state = state_with(4096);
    let all = templates(&state).await;
    let template = &all[0];
    let flavor = &template["flavors"][0];
    let reply = create(&state, body_from(template, flavor, "mine")).await;
    let created = reply;
    let id = created["endpoint_id"].as_str().unwrap().to_string();
    let uuid = uuid::Uuid::parse_str(&id).expect("a UUID");
    assert_eq!(uuid.get_version_num(), 4);
    assert_eq!(created["status"], "provisioning");
    assert_eq!(created["ai_project_id"], state.default_project.as_ref());
    assert_eq!(created["model_name"], template["model_name"]);
    let key = created["routing_key"].as_str().unwrap().to_string();
    assert!(key.starts_with(&format!("{}:", template["model_name"].as_str().unwrap())));

    // While provisioning: 503 shape B, "no available endpoints".
    let early = chat(&state, KEY, &key).await;
    if early.status == 503 {
        assert_eq!(early.json()["error"]["code"], 503, "{}", text(&early));
        assert!(text(&early).contains("no available endpoints"));
    }

    let running = wait_for(&state, &id, "running").await;
    assert_eq!(running["ready_replicas"], 1);
    // Listed among the project's models, by its routing key.
    let models = call(&state, "GET", "/v1/models", KEY, None).await.json();
    let listed = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == key.as_str())
        .unwrap_or_else(|| panic!("{models}"));
    assert_eq!(listed["parent"], template["model_name"]);

    // Served by the endpoint's engine, not the shared one.
    let shared_before = metric(
        &state,
        &format!("hearth_generation_tokens_total{{model=\"{MODEL}\"}}"),
    )
    .await;
    let reply = chat(&state, KEY, &key).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    let answer = reply.json();
    assert_eq!(answer["model"], key.as_str());
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{answer}");
    let own = metric(
        &state,
        &format!("hearth_endpoint_generation_tokens_total{{endpoint=\"{id}\"}}"),
    )
    .await;
    // The warm-up token and this answer's.
    assert!(own >= 2.0, "{own}");
    let shared_after = metric(
        &state,
        &format!("hearth_generation_tokens_total{{model=\"{MODEL}\"}}"),
    )
    .await;
    assert_eq!(shared_before, shared_after);

    // The same answer as the shared engine gives (greedy).
    let shared = chat(&state, KEY, MODEL).await;
    assert_eq!(
        shared.json()["choices"][0]["message"]["content"],
        answer["choices"][0]["message"]["content"]
    );

    // A name change does not reload anything.
    let uri = format!("/v0/dedicated_endpoints/{id}");
    let reply = call(
        &state,
        "PATCH",
        &uri,
        KEY,
        Some(json!({"name": "renamed", "description": "for tests"})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(reply.json()["name"], "renamed");
    assert_eq!(reply.json()["description"], "for tests");
    assert_eq!(reply.json()["status"], "running");

    // A flavor change reloads; the old replica serves meanwhile.
    let other = template["flavors"][1]["flavor_name"].as_str().unwrap();
    let reply = call(
        &state,
        "PATCH",
        &uri,
        KEY,
        Some(json!({"flavor_name": other})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(reply.json()["status"], "updating");
    assert_eq!(chat(&state, KEY, &key).await.status, 200);
    let updated = wait_for(&state, &id, "running").await;
    assert_eq!(updated["flavor_name"], other);

    // A restart brings it back.
    let after = restarted(&state);
    reconcile::reconcile_once(&after).await;
    // Whatever the endpoint says once the pass returns, `running` is true:
    // the store still held the last run's `running` while the replica was
    // loading, and a caller that waited for it got 503s.
    let status = list(&after, KEY)
        .await
        .into_iter()
        .find(|e| e["endpoint_id"] == id.as_str())
        .expect("the endpoint is listed")["status"]
        .clone();
    let early = chat(&after, KEY, &key).await;
    if status == "running" {
        assert_eq!(early.status, 200, "running but {}", text(&early));
    }
    assert!(
        early.status == 503 || early.status == 200,
        "{}",
        text(&early)
    );
    wait_for(&after, &id, "running").await;
    assert_eq!(chat(&after, KEY, &key).await.status, 200);

    // Delete: 200 `{}`, then the routing key is unknown.
    let reply = call(&after, "DELETE", &uri, KEY, None).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    assert_eq!(reply.json(), json!({}));
    let gone = chat(&after, KEY, &key).await;
    assert_eq!(gone.status, 404, "{}", text(&gone));
    let again = call(&after, "DELETE", &uri, KEY, None).await;
    assert_eq!(again.status, 403, "{}", text(&again));
    reconcile::reconcile_once(&after).await;
    assert!(list(&after, KEY)
        .await
        .iter()
        .all(|e| e["endpoint_id"] != id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_api_error_shapes() {
    let state = state_with(4096);
    let post = |body: Value| {
        let state = state.clone();
        async move { call(&state, "POST", "/v0/dedicated_endpoints", KEY, Some(body)).await }
    };
    let good = json!({"name": "x", "model_name": MODEL, "flavor_name": "cpu-medium"});
    let with = |k: &str, v: Value| {
        let mut b = good.clone();
        b[k] = v;
        b
    };
    shape_b_param(
        &post(with("model_name", json!("no/such-model"))).await,
        Some("model_name"),
    );
    shape_b_param(
        &post(with("flavor_name", json!("gpu-h100"))).await,
        Some("flavor_name"),
    );
    shape_b_param(
        &post(with("region", json!("eu-north1"))).await,
        Some("region"),
    );
    shape_b_param(
        &post(with("gpu_type", json!("gpu-h100-sxm"))).await,
        Some("gpu_type"),
    );
    shape_b_param(&post(with("gpu_count", json!(8))).await, Some("gpu_count"));
    shape_b_param(
        &post(with(
            "scaling",
            json!({"min_replicas": 3, "max_replicas": 1}),
        ))
        .await,
        Some("scaling.max_replicas"),
    );
    // Malformed bodies: 422 shape C.
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("name");
    assert_eq!(shape_c(&post(missing).await)["type"], "missing");
    shape_c(&post(with("scaling", json!("two"))).await);
    // Malformed ids: 422 at the path.
    for method in ["PATCH", "DELETE"] {
        let body = (method == "PATCH").then(|| json!({"name": "y"}));
        let reply = call(
            &state,
            method,
            "/v0/dedicated_endpoints/not-a-uuid",
            KEY,
            body,
        )
        .await;
        let item = shape_c(&reply);
        assert_eq!(item["loc"], json!(["path", "endpoint_id"]));
    }
    // A well-formed id nobody has: 403 shape A, as another account's.
    let reply = call(
        &state,
        "DELETE",
        &format!("/v0/dedicated_endpoints/{}", uuid::Uuid::new_v4()),
        KEY,
        None,
    )
    .await;
    assert_eq!(reply.status, 403, "{}", text(&reply));
    // Nothing was created by any of these.
    assert!(list(&state, KEY).await.is_empty());
    // A patch may not change what is fixed, nor take a wrong type.
    let reply = post(with("enabled", json!(false))).await;
    assert_eq!(reply.status, 201, "{}", text(&reply));
    assert_eq!(reply.json()["status"], "stopped");
    let uri = format!(
        "/v0/dedicated_endpoints/{}",
        reply.json()["endpoint_id"].as_str().unwrap()
    );
    let fixed = call(&state, "PATCH", &uri, KEY, Some(json!({"model_name": "m"}))).await;
    shape_b_param(&fixed, Some("model_name"));
    let wrong = call(&state, "PATCH", &uri, KEY, Some(json!({"enabled": "yes"}))).await;
    shape_c(&wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_does_not_fit_is_refused_with_what_is_missing() {
    // Room for one replica of the small flavor, not two.
    let probe = state_with(4096);
    let template = templates(&probe)
        .await
        .into_iter()
        .find(|t| t["model_name"] == MODEL)
        .unwrap();
    let one = template["flavors"][0]["resources"]["memory_mb"]
        .as_u64()
        .unwrap();
    let state = state_with(one * 3 / 2);
    let body = |replicas: u32, enabled: bool| {
        json!({"name": "x", "model_name": MODEL, "flavor_name": "cpu-medium",
               "scaling": {"min_replicas": replicas, "max_replicas": replicas},
               "enabled": enabled})
    };
    let reply = call(
        &state,
        "POST",
        "/v0/dedicated_endpoints",
        KEY,
        Some(body(2, true)),
    )
    .await;
    let message = shape_b_param(&reply, Some("flavor_name"));
    assert!(message.contains("MiB of memory more"), "{message}");
    assert!(list(&state, KEY).await.is_empty());
    // A stopped endpoint reserves nothing; starting it with two replicas
    // is refused the same way.
    let reply = create(&state, body(2, false)).await;
    let uri = format!(
        "/v0/dedicated_endpoints/{}",
        reply["endpoint_id"].as_str().unwrap()
    );
    let start = call(&state, "PATCH", &uri, KEY, Some(json!({"enabled": true}))).await;
    shape_b_param(&start, Some("flavor_name"));
    // Two cores: a flavor of two threads twice is over the threads.
    let threads = call(
        &probe,
        "POST",
        "/v0/dedicated_endpoints",
        KEY,
        Some(
            json!({"name": "t", "model_name": MODEL, "flavor_name": "cpu-large",
                    "scaling": {"min_replicas": 2, "max_replicas": 2}}),
        ),
    )
    .await;
    assert!(shape_b_param(&threads, Some("flavor_name")).contains("threads more"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_project_neither_sees_nor_reaches_an_endpoint() {
    let state = state_with(4096);
    let reply = create(
        &state,
        json!({"name": "x", "model_name": MODEL, "flavor_name": "cpu-medium",
                    "enabled": false}),
    )
    .await;
    let id = reply["endpoint_id"].as_str().unwrap().to_string();
    let routing_key = reply["routing_key"].as_str().unwrap().to_string();
    // The owner's stopped endpoint answers 503 by its key.
    let stopped = chat(&state, KEY, &routing_key).await;
    assert_eq!(stopped.status, 503, "{}", text(&stopped));

    let (_, other_key) = other_project(&state).await;
    assert!(list(&state, &other_key).await.is_empty());
    let uri = format!("/v0/dedicated_endpoints/{id}");
    for (method, body) in [
        ("PATCH", Some(json!({"name": "mine now"}))),
        ("DELETE", None),
    ] {
        let reply = call(&state, method, &uri, &other_key, body).await;
        assert_eq!(reply.status, 403, "{method}: {}", text(&reply));
    }
    let reply = chat(&state, &other_key, &routing_key).await;
    assert_eq!(reply.status, 404, "{}", text(&reply));
    let models = call(&state, "GET", "/v1/models", &other_key, None)
        .await
        .json();
    assert!(!models.to_string().contains(&routing_key), "{models}");
    // Untouched.
    let mine = list(&state, KEY).await;
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["name"], "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_scales_up_while_requests_wait_and_down_when_idle() {
    let state = state_with(4096);
    let reply = create(
        &state,
        json!({"name": "elastic", "model_name": MODEL, "flavor_name": "cpu-medium",
                    "scaling": {"min_replicas": 1, "max_replicas": 2}}),
    )
    .await;
    let id = reply["endpoint_id"].as_str().unwrap().to_string();
    let key = reply["routing_key"].as_str().unwrap().to_string();
    assert_eq!(wait_for(&state, &id, "running").await["ready_replicas"], 1);

    // More requests than the flavor's 16 slots: some wait on the one replica.
    let requests: Vec<_> = (0..24)
        .map(|i| {
            let state = state.clone();
            let key = key.clone();
            tokio::spawn(async move {
                call(
                    &state,
                    "POST",
                    "/v1/chat/completions",
                    KEY,
                    Some(json!({"model": key, "max_tokens": 96, "ignore_eos": true,
                                "messages": [{"role": "user", "content": format!("Count to {i}")}]})),
                )
                .await
                .status
            })
        })
        .collect();
    let start = Instant::now();
    let mut grew = false;
    while start.elapsed() < Duration::from_secs(120) {
        reconcile::reconcile_once(&state).await;
        if state.endpoints.ready_replicas(&id) == 2 {
            grew = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    assert!(grew, "no second replica while requests waited");
    // Idle (the test node's scale-down delay is zero): back to one.
    let start = Instant::now();
    while state.endpoints.ready_replicas(&id) > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never scaled down"
        );
        reconcile::reconcile_once(&state).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list(&state, KEY).await[0]["status"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_model_runs_as_an_endpoint() {
    const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";
    let state = state_with(4096);
    let all = templates(&state).await;
    let template = all
        .iter()
        .find(|t| t["model_name"] == EMBED)
        .unwrap_or_else(|| panic!("{all:?}"));
    let flavor = &template["flavors"][0];
    assert_eq!(flavor["resources"]["kv_cache_mb"], 0, "{template}");
    let reply = create(&state, body_from(template, flavor, "vectors")).await;
    let id = reply["endpoint_id"].as_str().unwrap().to_string();
    let key = reply["routing_key"].as_str().unwrap().to_string();
    wait_for(&state, &id, "running").await;

    let embed = |model: String| {
        let state = state.clone();
        async move {
            let reply = call(
                &state,
                "POST",
                "/v1/embeddings",
                KEY,
                Some(json!({"model": model, "input": ["A cat sat on the mat.", "Stocks fell."]})),
            )
            .await;
            assert_eq!(reply.status, 200, "{}", text(&reply));
            reply.json()
        }
    };
    let own = embed(key.clone()).await;
    let shared = embed(EMBED.to_string()).await;
    assert_eq!(own["model"], key.as_str());
    for i in 0..2 {
        let a: Vec<f64> = serde_json::from_value(own["data"][i]["embedding"].clone()).unwrap();
        let b: Vec<f64> = serde_json::from_value(shared["data"][i]["embedding"].clone()).unwrap();
        assert_eq!(a.len(), b.len());
        let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!(dot > 0.999, "input {i}: cosine {dot}");
    }
    // The wrong kind of route for this key: 400 naming `model`.
    shape_b_param(&chat(&state, KEY, &key).await, Some("model"));
    let rerank = call(
        &state,
        "POST",
        "/v1/rerank",
        KEY,
        Some(json!({"model": key, "query": "cats", "documents": ["A cat sat.", "Stocks fell."]})),
    )
    .await;
    assert_eq!(rerank.status, 200, "{}", text(&rerank));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fine_tuned_model_runs_with_its_adapter_merged() {
    use common::lora::{adapter, Jobs, FT};
    let dir = temp_dir();
    adapter(2, 192).save_dir(&dir.join("ft")).unwrap();
    let mut state = state_with(4096);
    state.adapter_source = Some(std::sync::Arc::new(Jobs(dir.join("ft"))));
    let all = templates(&state).await;
    let template = all
        .iter()
        .find(|t| t["model_name"] == FT)
        .unwrap_or_else(|| panic!("{all:?}"));
    let base = all.iter().find(|t| t["model_name"] == MODEL).unwrap();
    // The merged layers are Q8_0: the weights count twice.
    assert!(
        template["flavors"][0]["resources"]["memory_mb"].as_u64()
            > base["flavors"][0]["resources"]["memory_mb"].as_u64()
    );
    let reply = create(
        &state,
        body_from(template, &template["flavors"][0], "tuned"),
    )
    .await;
    let id = reply["endpoint_id"].as_str().unwrap().to_string();
    let key = reply["routing_key"].as_str().unwrap().to_string();
    wait_for(&state, &id, "running").await;

    let answer = |reply: Raw| {
        assert_eq!(reply.status, 200, "{}", text(&reply));
        reply.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let merged = answer(chat(&state, KEY, &key).await);
    let per_token = answer(chat(&state, KEY, FT).await);
    let plain = answer(chat(&state, KEY, MODEL).await);
    // The endpoint answers as the adapter does on the shared engine (its
    // Q8_0 rounding does not change these greedy tokens), not as the base.
    assert_eq!(merged, per_token);
    assert_ne!(merged, plain);
    // No adapter is loaded on the endpoint's engine: it was merged.
    let own = &state.endpoints.get(&id).unwrap().replicas()[0];
    match own.as_ref() {
        hearth_server::endpoints::Replica::Chat(m) => {
            assert!(m.engine.adapters().loaded().is_empty())
        }
        _ => panic!("a chat replica"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_endpoint_stops_its_requests_after_the_drain_deadline() {
    let state = state_with(4096);
    let created = create(
        &state,
        json!({"name": "short-lived", "model_name": MODEL, "flavor_name": "cpu-medium"}),
    )
    .await;
    let id = created["endpoint_id"].as_str().unwrap().to_string();
    let key = created["routing_key"].as_str().unwrap().to_string();
    wait_for(&state, &id, "running").await;
    let replica = state.endpoints.get(&id).unwrap().replicas()[0].clone();
    // A request that would run for minutes.
    let long = {
        let state = state.clone();
        tokio::spawn(async move {
            call(
                &state,
                "POST",
                "/v1/chat/completions",
                KEY,
                Some(json!({"model": key, "max_tokens": 8000, "ignore_eos": true,
                            "messages": [{"role": "user", "content": "Go on forever."}]})),
            )
            .await
        })
    };
    let hearth_server::endpoints::Replica::Chat(engine) = replica.as_ref() else {
        panic!("a chat replica")
    };
    let start = Instant::now();
    while engine.engine.active_sequences() == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let uri = format!("/v0/dedicated_endpoints/{id}");
    assert_eq!(call(&state, "DELETE", &uri, KEY, None).await.status, 200);
    // Stopped after the test node's one-second deadline: 503 shape B.
    let reply = tokio::time::timeout(Duration::from_secs(60), long)
        .await
        .expect("the request outlived the drain deadline")
        .unwrap();
    assert_eq!(reply.status, 503, "{}", text(&reply));
    assert_eq!(reply.json()["error"]["code"], 503);
}
