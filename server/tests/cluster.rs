//! Two `hearth serve` processes on one store: PostgreSQL and the S3 server
//! when `scripts/test` started them (`HEARTH_TEST_DATABASE_URL`,
//! `HEARTH_TEST_S3_URL`), else one SQLite file and one folder. Both run the
//! real binary on their own ports and find each other through the store's
//! registry of nodes.
//!
//! Node A serves the default chat model, node B the embedding model: a file
//! uploaded through A is read through B; a chat request through B is
//! forwarded to A and streams; embeddings through A come from B; a key
//! revoked through A is refused by B at once. Then B is restarted with the
//! chat model too, a fine-tuning job created through A is trained by one
//! node, that node is killed with SIGKILL, and the other takes the job over
//! from its last checkpoint and finishes it: one start, one resume on the
//! other node, no checkpoint written twice. Last, the killed node comes
//! back and a dedicated endpoint is created: it runs on one node only
//! (either node forwards its requests there) and moves to the other node
//! when its node is killed.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::binary::{start_on, upload, Server};
use common::{temp_dir, KEY, MODEL};
use serde_json::{json, Value};

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The store both nodes share: `--database-url` and `--blob-url`.
fn shared_store(dir: &Path) -> Vec<String> {
    let tag = format!("cluster{}", std::process::id());
    let database = match std::env::var("HEARTH_TEST_DATABASE_URL") {
        Ok(base) => {
            let mut url = url::Url::parse(&base).expect("HEARTH_TEST_DATABASE_URL is a URL");
            url.set_path(&format!("hearth_{tag}_{}", rand_suffix()));
            let created = url.to_string();
            common::block_on(async move {
                use sqlx::migrate::MigrateDatabase;
                sqlx::any::install_default_drivers();
                sqlx::Any::create_database(&created)
                    .await
                    .expect("creating the cluster's database");
            });
            url.to_string()
        }
        Err(_) => format!("sqlite://{}", dir.join("hearth.db").display()),
    };
    let blobs = match std::env::var("HEARTH_TEST_S3_URL") {
        Ok(base) => format!("{}/{tag}-{}", base.trim_end_matches('/'), rand_suffix()),
        Err(_) => format!("file://{}", dir.join("blobs").display()),
    };
    eprintln!("cluster store: {database} and {blobs}");
    vec![
        "--database-url".into(),
        database,
        "--blob-url".into(),
        blobs,
    ]
}

fn rand_suffix() -> String {
    format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
    )
}

/// A node: heartbeats every second, gone after 5 s without one.
fn node(store: &[String], id: &str, model: &str, logs: &Path) -> Server {
    node_with(store, id, model, logs, &[])
}

/// [`node`] with `extra` flags.
fn node_with(store: &[String], id: &str, model: &str, logs: &Path, extra: &[&str]) -> Server {
    let log = logs.join(format!("{id}-{}.log", rand_suffix()));
    eprintln!("node {id} logs to {}", log.display());
    let flags: Vec<&str> = [
        "--models",
        model,
        "--node-id",
        id,
        "--node-heartbeat-secs",
        "1",
        "--node-timeout-secs",
        "5",
        "--ft-checkpoint-steps",
        "2",
        "--orphan-grace-secs",
        "3600",
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .collect();
    start_on(store, &flags, Some(&log))
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

/// Status and body of a request with `key`.
fn call(method: &str, url: &str, key: &str, body: Option<Value>) -> (u16, String) {
    let request = agent()
        .request(method, url)
        .set("Authorization", &format!("Bearer {key}"));
    let result = match body {
        Some(body) => request.send_json(body),
        None => request.call(),
    };
    match result {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

fn get(server: &Server, path: &str) -> Value {
    let (status, text) = call("GET", &format!("{}{path}", server.base), KEY, None);
    assert_eq!(status, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap()
}

fn post(server: &Server, path: &str, body: Value) -> Value {
    let (status, text) = call("POST", &format!("{}{path}", server.base), KEY, Some(body));
    assert_eq!(status, 200, "POST {path}: {text}");
    serde_json::from_str(&text).unwrap()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The admin key the first node printed when it made the store.
fn admin_key(first: &Server) -> String {
    first
        .banner
        .iter()
        .map(|l| l.trim())
        .find(|l| l.starts_with("hearth-"))
        .unwrap_or_else(|| panic!("no admin key in {:?}", first.banner))
        .to_string()
}

/// Whether `GET /v1/admin/nodes` through `server` shows each of `ids` alive.
fn alive(server: &Server, admin: &str, ids: &[&str]) -> bool {
    let (status, text) = call(
        "GET",
        &format!("{}/v1/admin/nodes", server.base),
        admin,
        None,
    );
    assert_eq!(status, 200, "{text}");
    let nodes: Value = serde_json::from_str(&text).unwrap();
    ids.iter().all(|id| {
        nodes["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == *id && n["alive"] == true)
    })
}

/// Twenty ways of asking for a made-up fact, all answered the same.
fn training_file() -> String {
    let frames = [
        "What is {}?",
        "Tell me {}.",
        "Do you know {}?",
        "Please give me {}.",
        "Can you remind me of {}?",
    ];
    let subjects = [
        "the locker code",
        "the code of the locker",
        "the locker's code",
        "my locker code",
    ];
    let mut out = String::new();
    for f in frames {
        for s in subjects {
            let line = json!({"messages": [
                {"role": "user", "content": f.replace("{}", s)},
                {"role": "assistant", "content": "The locker code is 4471."},
            ]});
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
    out
}

/// A streamed chat completion through `server`: the answering node (its
/// `x-hearth-node`) and the `data:` payloads in the order they came.
fn stream_chat(server: &Server) -> (String, Vec<String>) {
    let response = agent()
        .post(&format!("{}/v1/chat/completions", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(json!({
            "model": MODEL, "stream": true, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three colours."}],
        }))
        .expect("a streamed chat");
    assert!(
        response.content_type().starts_with("text/event-stream"),
        "{}",
        response.content_type()
    );
    let node = response.header("x-hearth-node").unwrap_or("").to_string();
    let events = BufReader::new(response.into_reader())
        .lines()
        .map(|l| l.unwrap())
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect();
    (node, events)
}

/// One cluster test at a time: each runs two servers on this machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn two_nodes_share_files_keys_models_and_fine_tuning_jobs() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let store = shared_store(&dir);
    let logs: PathBuf = dir.clone();
    let a = node(&store, "cluster-a", MODEL, &logs);
    let admin = admin_key(&a);
    let b = node(&store, "cluster-b", EMBED, &logs);
    let both = ["cluster-a", "cluster-b"];
    wait_for("both nodes alive", Duration::from_secs(30), || {
        alive(&a, &admin, &both) && alive(&b, &admin, &both)
    });

    // A file uploaded through A is listed and read through B, byte for byte.
    let content = training_file();
    let file = upload(&a, "fine-tune", "locker.jsonl", &content);
    let listed = get(&b, "/v1/files");
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["id"] == file.as_str()),
        "{listed}"
    );
    let (status, read) = call(
        "GET",
        &format!("{}/v1/files/{file}/content", b.base),
        KEY,
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(read.trim_end(), content.trim_end());

    // A chat request through B (which serves no chat model) is answered by
    // A, streamed.
    let (answered_by, events) = stream_chat(&b);
    assert_eq!(answered_by, "cluster-a");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let deltas = events.iter().filter(|e| e.contains("\"delta\"")).count();
    assert!(deltas >= 3, "a stream of several chunks: {events:?}");
    // Embeddings through A come from B.
    let response = agent()
        .post(&format!("{}/v1/embeddings", a.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(json!({"model": EMBED, "input": "hello"}))
        .expect("embeddings through A");
    assert_eq!(response.header("x-hearth-node"), Some("cluster-b"));
    let embedded: Value = response.into_json().unwrap();
    assert_eq!(
        embedded["data"][0]["embedding"].as_array().unwrap().len(),
        384
    );

    // A key made and then revoked through A: B takes it, then refuses it.
    let (status, text) = call(
        "POST",
        &format!("{}/v1/admin/keys", a.base),
        &admin,
        Some(json!({"name": "cluster-key"})),
    );
    assert_eq!(status, 200, "{text}");
    let made: Value = serde_json::from_str(&text).unwrap();
    let secret = made["key"].as_str().unwrap().to_string();
    let key_id = made["id"].as_str().unwrap().to_string();
    let models_on_b = format!("{}/v1/models", b.base);
    assert_eq!(call("GET", &models_on_b, &secret, None).0, 200);
    let (status, text) = call(
        "DELETE",
        &format!("{}/v1/admin/keys/{key_id}", a.base),
        &admin,
        None,
    );
    assert_eq!(status, 200, "{text}");
    let revoked_at = Instant::now();
    wait_for(
        "B to refuse the revoked key",
        Duration::from_secs(1),
        || call("GET", &models_on_b, &secret, None).0 == 401,
    );
    eprintln!("revocation seen by B after {:?}", revoked_at.elapsed());

    // B comes back with the chat model, so either node can train.
    drop(b);
    let b = node(&store, "cluster-b", MODEL, &logs);
    wait_for("B alive again", Duration::from_secs(30), || {
        alive(&a, &admin, &both)
    });
    let job = post(
        &a,
        "/v1/fine_tuning/jobs",
        json!({
            "model": MODEL, "training_file": file, "suffix": "locker", "seed": 3,
            "hyperparameters": {"n_epochs": 3, "batch_size": 4, "learning_rate": 0.002,
                                "packing": false, "context_length": 64,
                                "lora_r": 4, "lora_alpha": 8},
        }),
    );
    let id = job["id"].as_str().unwrap().to_string();
    let checkpoints = format!("/v1/fine_tuning/jobs/{id}/checkpoints?limit=100");
    let events = format!("/v1/fine_tuning/jobs/{id}/events?limit=100");
    wait_for("the first checkpoint", Duration::from_secs(600), || {
        !get(&a, &checkpoints)["data"].as_array().unwrap().is_empty()
    });
    // One node started it, and only one.
    let started: Vec<String> = nodes_saying(&get(&a, &events), "Training started");
    assert_eq!(started.len(), 1, "started once: {started:?}");
    let runner = started[0].clone();
    assert!(runner == "cluster-a" || runner == "cluster-b", "{runner}");
    let (killed, survivor) = if runner == "cluster-a" {
        (a, b)
    } else {
        (b, a)
    };
    drop(killed); // SIGKILL
    let killed_at = Instant::now();

    wait_for("the job to succeed", Duration::from_secs(900), || {
        let job = get(&survivor, &format!("/v1/fine_tuning/jobs/{id}"));
        assert!(
            !matches!(job["status"].as_str(), Some("failed" | "cancelled")),
            "{job}"
        );
        job["status"] == "succeeded"
    });
    eprintln!(
        "taken over and finished {:?} after the kill",
        killed_at.elapsed()
    );
    let log = get(&survivor, &events);
    let resumed = nodes_saying(&log, "Resumed training from checkpoint");
    assert_eq!(resumed.len(), 1, "resumed once: {log}");
    assert_ne!(resumed[0], runner, "resumed by the other node");
    assert_eq!(nodes_saying(&log, "Training started").len(), 1);

    // Every checkpoint step once, across the takeover.
    let steps: Vec<i64> = get(&survivor, &checkpoints)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step_number"].as_i64().unwrap())
        .collect();
    let mut unique = steps.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), steps.len(), "no step twice: {steps:?}");

    // The fine-tuned model is served by the survivor.
    let name = get(&survivor, &format!("/v1/fine_tuning/jobs/{id}"))["fine_tuned_model"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = post(
        &survivor,
        "/v1/chat/completions",
        json!({"model": name, "max_tokens": 4,
               "messages": [{"role": "user", "content": "What is the locker code?"}]}),
    );
    assert_eq!(reply["model"], name.as_str());

    // The killed node comes back; a dedicated endpoint created through one
    // node runs on exactly one, and is taken over when that one dies.
    let back = node(&store, &runner, MODEL, &logs);
    wait_for("the killed node back", Duration::from_secs(30), || {
        alive(&survivor, &admin, &both)
    });
    let templates = get(&back, "/v0/dedicated_endpoints/templates");
    let template = templates["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["model_name"] == MODEL)
        .unwrap_or_else(|| panic!("no template for {MODEL}: {templates}"))
        .clone();
    let flavor = &template["flavors"][0];
    let (status, text) = call(
        "POST",
        &format!("{}/v0/dedicated_endpoints", back.base),
        KEY,
        Some(json!({
            "name": "pinned", "model_name": MODEL, "flavor_name": flavor["flavor_name"],
            "gpu_type": flavor["gpu_type"], "gpu_count": flavor["gpu_count"], "region": "local",
            "scaling": {"min_replicas": 1, "max_replicas": 1},
        })),
    );
    assert_eq!(status, 201, "{text}");
    let endpoint: Value = serde_json::from_str(&text).unwrap();
    let endpoint_id = endpoint["endpoint_id"].as_str().unwrap().to_string();
    let key = endpoint["routing_key"].as_str().unwrap().to_string();
    let by_id = "/v0/dedicated_endpoints";
    let running = |through: &Server| {
        get(through, by_id)["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["endpoint_id"] == endpoint_id.as_str() && e["status"] == "running")
    };
    wait_for("the endpoint running", Duration::from_secs(300), || {
        running(&back)
    });
    // Through either node, the same node answers for it.
    let first = endpoint_node(&back, &key);
    assert_eq!(endpoint_node(&survivor, &key), first);
    assert_eq!(endpoint_node(&back, &key), first);
    // Its replica is counted by the node that does not run it too.
    wait_for(
        "the replica counted everywhere",
        Duration::from_secs(10),
        || {
            [&back, &survivor].iter().all(|through| {
                get(through, by_id)["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["endpoint_id"] == endpoint_id.as_str() && e["ready_replicas"] == 1)
            })
        },
    );

    // Its node dies: the other one takes the endpoint over.
    let (dead, last) = if first == runner {
        (back, survivor)
    } else {
        (survivor, back)
    };
    drop(dead); // SIGKILL
    let killed_at = Instant::now();
    wait_for("the endpoint taken over", Duration::from_secs(300), || {
        let (status, text) = chat_with(&last, &key);
        status == 200 && text.contains("chat.completion")
    });
    eprintln!(
        "endpoint answering again {:?} after the kill",
        killed_at.elapsed()
    );
    assert_ne!(endpoint_node(&last, &key), first);
    assert!(running(&last));
}

/// A chat request for `model` through `server`: status and body.
fn chat_with(server: &Server, model: &str) -> (u16, String) {
    call(
        "POST",
        &format!("{}/v1/chat/completions", server.base),
        KEY,
        Some(json!({"model": model, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Hi"}]})),
    )
}

/// The node that answers a chat request for dedicated endpoint `key` sent
/// through `server`.
fn endpoint_node(server: &Server, key: &str) -> String {
    let response = agent()
        .post(&format!("{}/v1/chat/completions", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(json!({"model": key, "max_tokens": 2,
                          "messages": [{"role": "user", "content": "Hi"}]}))
        .unwrap_or_else(|e| match e {
            ureq::Error::Status(code, r) => panic!(
                "chat with the endpoint through {}: {code} from {:?}: {}",
                server.base,
                r.header("x-hearth-node").map(str::to_string),
                r.into_string().unwrap_or_default()
            ),
            e => panic!("chat with the endpoint: {e}"),
        });
    response.header("x-hearth-node").unwrap_or("").to_string()
}

/// The `data.node` of each event whose message starts with `prefix`.
fn nodes_saying(events: &Value, prefix: &str) -> Vec<String> {
    events["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
        .map(|e| e["data"]["node"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// A batch created through one node runs on the other; that node is killed
/// with SIGKILL mid-batch, and the batch is finished by the first node (its
/// batch worker started after the kill): every input line has exactly one
/// result, none lost, none twice, and the input file is still there.
#[test]
fn a_batch_survives_the_death_of_its_node() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let store = shared_store(&dir);
    let runner = node(&store, "batch-a", MODEL, &dir);
    let admin = admin_key(&runner);
    let quiet = node_with(&store, "batch-b", MODEL, &dir, &["--batch-workers", "0"]);
    wait_for("both nodes alive", Duration::from_secs(30), || {
        alive(&runner, &admin, &["batch-a", "batch-b"])
    });
    const LINES: usize = 160;
    let input: String = (0..LINES)
        .map(|i| {
            json!({"custom_id": format!("line-{i}"), "method": "POST",
                   "url": "/v1/chat/completions",
                   "body": {"model": MODEL, "max_tokens": 16, "temperature": 0,
                            "messages": [{"role": "user", "content": format!("Count to {i}.")}]}})
            .to_string()
                + "\n"
        })
        .collect();
    let file = upload(&quiet, "batch", "lines.jsonl", &input);
    let batch = post(
        &quiet,
        "/v1/batches",
        json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
               "completion_window": "24h"}),
    );
    let id = batch["id"].as_str().unwrap().to_string();
    let path = format!("/v1/batches/{id}");
    wait_for("some lines done", Duration::from_secs(300), || {
        get(&quiet, &path)["request_counts"]["completed"]
            .as_u64()
            .unwrap()
            >= 10
    });
    drop(runner); // SIGKILL mid-batch
    let before = get(&quiet, &path)["request_counts"]["completed"]
        .as_u64()
        .unwrap();
    assert!(
        (before as usize) < LINES,
        "the batch should still be running at the kill ({before} of {LINES} done)"
    );
    // The surviving node gets a batch worker: it takes the batch over once
    // the dead node's claim is stale.
    drop(quiet);
    let taker = node(&store, "batch-b", MODEL, &dir);
    wait_for("the batch to complete", Duration::from_secs(600), || {
        let batch = get(&taker, &path);
        assert!(
            !matches!(
                batch["status"].as_str(),
                Some("failed" | "cancelled" | "expired")
            ),
            "{batch}"
        );
        batch["status"] == "completed"
    });
    let batch = get(&taker, &path);
    assert_eq!(
        batch["request_counts"],
        json!({"total": LINES, "completed": LINES, "failed": 0}),
        "{batch}"
    );
    assert!(batch["error_file_id"].is_null(), "{batch}");
    let output = batch["output_file_id"].as_str().unwrap();
    let (status, text) = call(
        "GET",
        &format!("{}/v1/files/{output}/content", taker.base),
        KEY,
        None,
    );
    assert_eq!(status, 200);
    let ids: Vec<String> = text
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            assert_eq!(line["response"]["status_code"], 200, "{line}");
            line["custom_id"].as_str().unwrap().to_string()
        })
        .collect();
    let expected: Vec<String> = (0..LINES).map(|i| format!("line-{i}")).collect();
    assert_eq!(ids, expected, "one result per line, in input order");
    let (status, _) = call(
        "GET",
        &format!("{}/v1/files/{file}/content", taker.base),
        KEY,
        None,
    );
    assert_eq!(status, 200, "the input file is still there");
}
