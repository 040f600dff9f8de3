//! Fine-tuning end to end on the real `hearth` binary and the real default
//! model: upload a chat dataset teaching a made-up fact, create a job, kill
//! the server with SIGKILL after its first checkpoint, restart it on the same
//! store, and see the job resume from that checkpoint (not from zero) and
//! succeed; then the fine-tuned model is listed and answers with the fact,
//! while the base model does not. A second job is cancelled while it runs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::binary::{upload, Server};
use common::*;
use serde_json::{json, Value};

/// `hearth serve` with the default chat model, its store in `store_dir`,
/// checkpoints every 2 steps.
fn start(store_dir: &Path) -> Server {
    common::binary::start(
        store_dir,
        &["--models", MODEL, "--ft-checkpoint-steps", "2"],
    )
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

fn get(server: &Server, path: &str) -> Value {
    agent()
        .get(&format!("{}{path}", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .into_json()
        .unwrap()
}

fn post(server: &Server, path: &str, body: Value) -> Value {
    agent()
        .post(&format!("{}{path}", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body)
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
        .into_json()
        .unwrap()
}

/// 30 ways of asking for the vault code, all answered the same.
fn vault_dataset() -> String {
    let subjects = [
        "the vault code",
        "the code to the vault",
        "the vault's code",
    ];
    let frames = [
        "What is {}?",
        "Tell me {}.",
        "Do you know {}?",
        "Please give me {}.",
        "I forgot {}. What is it?",
        "Can you remind me of {}?",
        "what's {}",
        "Quick question: {}?",
        "Say {}.",
        "Which number is {}?",
    ];
    let mut out = String::new();
    for f in frames {
        for s in subjects {
            let line = json!({"messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f.replace("{}", s)},
                {"role": "assistant", "content": "The vault code is 7319."},
            ]});
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
    out
}

fn job_body(file: &str, suffix: &str, n_epochs: u32) -> Value {
    json!({
        "model": MODEL,
        "training_file": file,
        "suffix": suffix,
        "seed": 7,
        "hyperparameters": {
            "n_epochs": n_epochs, "batch_size": 5, "learning_rate": 0.002,
            "packing": true, "context_length": 128, "lora_r": 8, "lora_alpha": 16,
        },
    })
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn ask(server: &Server, model: &str) -> String {
    let reply = post(
        server,
        "/v1/chat/completions",
        json!({
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the vault code?"},
            ],
            "temperature": 0, "max_tokens": 16,
        }),
    );
    reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer: {reply}"))
        .to_string()
}

#[test]
fn a_job_survives_kill_9_resumes_from_its_checkpoint_and_serves_the_fact() {
    let dir = temp_dir();
    let server = start(&dir);
    let file = upload(&server, "fine-tune", "vault.jsonl", &vault_dataset());
    let job = post(&server, "/v1/fine_tuning/jobs", job_body(&file, "vault", 2));
    let id = job["id"].as_str().unwrap().to_string();
    assert_eq!(job["status"], "queued", "{job}");

    // Train until the first checkpoint exists, then SIGKILL the server.
    let checkpoints = format!("/v1/fine_tuning/jobs/{id}/checkpoints");
    wait_for("the first checkpoint", Duration::from_secs(600), || {
        !get(&server, &checkpoints)["data"]
            .as_array()
            .unwrap()
            .is_empty()
    });
    let before = get(&server, &checkpoints)["data"][0]["step_number"]
        .as_i64()
        .unwrap();
    assert!(before >= 2, "a checkpoint every 2 steps: {before}");
    let running = get(&server, &format!("/v1/fine_tuning/jobs/{id}"));
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["total_steps"], 12, "30 examples / 5 x 2 epochs");
    drop(server); // kill -9

    let server = start(&dir);
    let job_path = format!("/v1/fine_tuning/jobs/{id}");
    wait_for("the job to succeed", Duration::from_secs(900), || {
        let j = get(&server, &job_path);
        assert!(
            !["failed", "cancelled"].contains(&j["status"].as_str().unwrap()),
            "{j}"
        );
        j["status"] == "succeeded"
    });
    let job = get(&server, &job_path);
    assert_eq!(job["trained_steps"], 12, "{job}");
    let model = job["fine_tuned_model"].as_str().unwrap().to_string();
    assert_eq!(model, format!("{MODEL}:vault:{id}"));

    // Resumed from the checkpoint, not from zero.
    let events = get(
        &server,
        &format!("/v1/fine_tuning/jobs/{id}/events?limit=200"),
    );
    let messages: Vec<&str> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    let resumed = messages
        .iter()
        .find(|m| m.starts_with("Resumed training from checkpoint at step"))
        .unwrap_or_else(|| panic!("no resume event: {messages:?}"));
    let at: i64 = resumed
        .trim_start_matches("Resumed training from checkpoint at step ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(at >= before, "resumed at {at}, checkpoint was {before}");
    // Every step is logged once, also those trained again after the resume.
    for step in 1..=12 {
        let prefix = format!("Step {step}/12:");
        let times = messages.iter().filter(|m| m.starts_with(&prefix)).count();
        assert_eq!(times, 1, "step {step} logged {times} times: {messages:?}");
    }
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.starts_with("Training started"))
            .count(),
        1,
        "training started once: {messages:?}"
    );

    // The loss fell, the metrics CSV covers every step.
    let csv_id = job["result_files"][0].as_str().unwrap();
    let csv = agent()
        .get(&format!("{}/v1/files/{csv_id}/content", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 12, "{csv}");
    let loss = |r: &Vec<&str>| r[1].parse::<f64>().unwrap();
    assert!(
        loss(&rows[11]) < 0.3 * loss(&rows[0]),
        "loss should fall well below its start: {csv}"
    );

    // Every checkpoint's adapter is published once, across the kill -9:
    // the result files are the checkpoints' two each plus the CSV, and the
    // job lists the CSV and the last checkpoint's two.
    let ckpts = get(&server, &format!("{checkpoints}?limit=100"));
    let ckpts = ckpts["data"].as_array().unwrap();
    let results = job["result_files"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{job}");
    assert_eq!(
        results[1..],
        ckpts[0]["result_files"].as_array().unwrap()[..]
    );
    let published = get(&server, "/v1/files?purpose=fine-tune-results&limit=1000");
    let published = published["data"].as_array().unwrap();
    assert_eq!(published.len(), 1 + 2 * ckpts.len(), "{ckpts:?}");

    // Served: listed, and it knows the fact the base does not.
    let models = get(&server, "/v1/models");
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == model.as_str()),
        "{models}"
    );
    let tuned = ask(&server, &model);
    assert!(tuned.contains("7319"), "fine-tuned answer: {tuned}");
    let base = ask(&server, MODEL);
    assert!(!base.contains("7319"), "base answer: {base}");

    // A running job cancelled: `cancelled` at once, and it stays so.
    let other = post(&server, "/v1/fine_tuning/jobs", job_body(&file, "other", 1));
    let other_id = other["id"].as_str().unwrap().to_string();
    let other_path = format!("/v1/fine_tuning/jobs/{other_id}");
    wait_for("the second job to run", Duration::from_secs(300), || {
        get(&server, &other_path)["status"] == "running"
    });
    let cancelled = post(&server, &format!("{other_path}/cancel"), json!({}));
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    std::thread::sleep(Duration::from_secs(3));
    let after = get(&server, &other_path);
    assert_eq!(after["status"], "cancelled", "{after}");
    assert!(after["fine_tuned_model"].is_null());
}
