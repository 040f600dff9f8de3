//! Adapters out and in, on the real default model.
//!
//! Out: a fine-tuning job run by the worker in-process (stopped after its
//! first checkpoint and resumed by another worker) publishes each
//! checkpoint's adapter as two files, listed in the checkpoint's and the
//! job's `result_files`, that download byte for byte (with the key and
//! through a signed link) and load back as the same PEFT adapter; no file
//! is published twice.
//!
//! In: `POST /v1/admin/adapters` and `hearth models import-adapter` check
//! an outside PEFT adapter against the base and register it for a project;
//! it then answers chat like a fine-tuned model (greedy output differs from
//! the base with a non-zero B, equals it with B zero), is listed in that
//! project's /v1/models, and is unknown (404) to another project. Wrong
//! shapes, unknown bases, missing files and taken names are refused (400).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::lora::adapter;
use common::raw::{self, shape_b_param, upload_as, Raw};
use common::*;
use hearth_models::LoraAdapter;
use hearth_server::AppState;
use serde_json::{json, Value};

/// The default model's state on a fresh store of its own.
fn state() -> AppState {
    let (store, project) = new_store();
    AppState {
        adapter_source: Some(std::sync::Arc::new(
            hearth_server::fine_tuned::FineTunedModels {
                store: store.clone(),
            },
        )),
        store,
        default_project: project.into(),
        ..with_model()
    }
}

async fn call(state: &AppState, method: &str, uri: &str, key: &str, body: Option<Value>) -> Raw {
    raw::call(state, method, uri, key, body).await
}

async fn ok_json(state: &AppState, uri: &str) -> Value {
    let reply = raw::get(state, uri, Some(KEY)).await;
    reply.expect_status(200);
    reply.json()
}

async fn chat(state: &AppState, key: &str, model: &str) -> Raw {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 16,
        "temperature": 0,
    });
    call(state, "POST", "/v1/chat/completions", key, Some(body)).await
}

/// The greedy answer of `model` (which must be served to `KEY`).
async fn answer(state: &AppState, model: &str) -> String {
    let reply = chat(state, KEY, model).await;
    reply.expect_status(200);
    reply.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn same_adapter(a: &LoraAdapter, b: &LoraAdapter) {
    assert_eq!(a.config, b.config);
    assert_eq!(a.layers.len(), b.layers.len());
    for (la, lb) in a.layers.iter().zip(&b.layers) {
        assert_eq!(la.keys().collect::<Vec<_>>(), lb.keys().collect::<Vec<_>>());
        for (t, wa) in la {
            let wb = &lb[t];
            for (x, y) in [(&wa.a, &wb.a), (&wa.b, &wb.b)] {
                let (x, y) = (
                    x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert_eq!(x, y, "{t:?}");
            }
        }
    }
}

fn worker(state: &AppState, name: &str) -> hearth_jobs::Worker {
    let model = &state.chat[MODEL];
    let path = model.entry.weights_path(&data_dir().join("models"));
    let mut bases = BTreeMap::new();
    bases.insert(MODEL.to_string(), hearth_jobs::BaseModel::Gguf(path));
    hearth_jobs::Worker::new(
        state.store.clone(),
        bases,
        hearth_jobs::WorkerConfig {
            worker_id: name.to_string(),
            checkpoint_every: 1,
            poll: Duration::from_millis(20),
            nice: 0,
            ..Default::default()
        },
    )
}

/// Polls `uri` (as `KEY`) until `done` says yes.
async fn wait_for(state: &AppState, what: &str, uri: &str, done: impl Fn(&Value) -> bool) {
    let start = Instant::now();
    while !done(&ok_json(state, uri).await) {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn download(state: &AppState, file: &str) -> Vec<u8> {
    let reply = raw::get(state, &format!("/v1/files/{file}/content"), Some(KEY)).await;
    reply.expect_status(200);
    // The same bytes through a signed link, without a key.
    let link = ok_json(state, &format!("/v1/files/{file}/link")).await;
    let url = link["url"].as_str().unwrap();
    let path = &url[url.find("/v1/").unwrap()..];
    let linked = raw::get(state, path, None).await;
    linked.expect_status(200);
    assert_eq!(linked.bytes, reply.bytes, "{file}: the link's bytes differ");
    reply.bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoints_are_published_as_peft_files_once() {
    let state = state();
    let lines: String = (0..4)
        .map(|i| {
            json!({"messages": [
                {"role": "user", "content": format!("What is code {i}?")},
                {"role": "assistant", "content": format!("Code {i} is {}.", 7000 + i)},
            ]})
            .to_string()
                + "\n"
        })
        .collect();
    let file = raw::upload(&state, "fine-tune", lines.as_bytes()).await;
    let body = json!({"model": MODEL, "training_file": file["id"], "suffix": "out", "seed": 3,
        "hyperparameters": {"n_epochs": 1, "batch_size": 1, "context_length": 64,
            "lora_r": 4, "learning_rate": 0.01}});
    let job = call(&state, "POST", "/v1/fine_tuning/jobs", KEY, Some(body)).await;
    job.expect_status(200);
    let id = job.json()["id"].as_str().unwrap().to_string();
    let job_uri = format!("/v1/fine_tuning/jobs/{id}");
    let checkpoints_uri = format!("{job_uri}/checkpoints");

    // One worker until the first checkpoint, then it stops in good order
    // and another resumes the job from it.
    let first = worker(&state, "node-a").spawn();
    wait_for(&state, "the first checkpoint", &checkpoints_uri, |c| {
        !c["data"].as_array().unwrap().is_empty()
    })
    .await;
    first.shut_down().await;
    let second = worker(&state, "node-b").spawn();
    wait_for(&state, "the job to succeed", &job_uri, |j| {
        assert!(
            !["failed", "cancelled"].contains(&j["status"].as_str().unwrap()),
            "{j}"
        );
        j["status"] == "succeeded"
    })
    .await;
    second.shut_down().await;
    let job = ok_json(&state, &job_uri).await;
    assert_eq!(job["trained_steps"], 4, "{job}");
    let events = ok_json(&state, &format!("{job_uri}/events?limit=100"))
        .await
        .to_string();
    assert!(
        events.contains("Resumed training from checkpoint"),
        "{events}"
    );

    let checkpoints = ok_json(&state, &format!("{checkpoints_uri}?limit=100")).await["data"]
        .as_array()
        .unwrap()
        .clone();
    let stored = state
        .store
        .list_ft_checkpoints(&id, 100, None)
        .await
        .unwrap()
        .0;
    assert_eq!(checkpoints.len(), stored.len());
    let mut published = Vec::new();
    for (c, row) in checkpoints.iter().zip(&stored) {
        let files: Vec<String> = serde_json::from_value(c["result_files"].clone()).unwrap();
        assert_eq!(files.len(), 2, "{c}");
        for (file, name) in files
            .iter()
            .zip(["adapter_model.safetensors", "adapter_config.json"])
        {
            let meta = ok_json(&state, &format!("/v1/files/{file}")).await;
            assert_eq!(meta["filename"], name, "{meta}");
            assert_eq!(meta["purpose"], "fine-tune-results", "{meta}");
        }
        // Byte for byte what the server serves the checkpoint from, and the
        // same adapter once loaded as PEFT.
        let weights = download(&state, &files[0]).await;
        let config = String::from_utf8(download(&state, &files[1]).await).unwrap();
        let blobs = state.store.blobs();
        let kept_weights = blobs
            .get(&format!("{}/adapter_model.safetensors", row.blob_prefix))
            .await
            .unwrap();
        let kept_config = blobs
            .get(&format!("{}/adapter_config.json", row.blob_prefix))
            .await
            .unwrap();
        assert!(weights == kept_weights);
        assert_eq!(config.as_bytes(), kept_config);
        let got = LoraAdapter::from_peft(&weights, &config, 30).unwrap();
        let served =
            LoraAdapter::from_peft(&kept_weights, &String::from_utf8(kept_config).unwrap(), 30)
                .unwrap();
        same_adapter(&got, &served);
        assert_eq!((got.config.r, got.config.targets.len()), (4, 7));
        published.extend(files);
    }
    // The job: the metrics CSV, then the final (newest) checkpoint's files.
    let results: Vec<String> = serde_json::from_value(job["result_files"].clone()).unwrap();
    assert_eq!(results.len(), 3, "{job}");
    let last: Vec<String> = serde_json::from_value(checkpoints[0]["result_files"].clone()).unwrap();
    assert_eq!(results[1..], last[..]);
    let csv = String::from_utf8(download(&state, &results[0]).await).unwrap();
    assert!(csv.starts_with("step,train_loss"), "{csv}");
    published.push(results[0].clone());
    // Nothing published twice or left unlisted, across the resume.
    let listed = ok_json(&state, "/v1/files?purpose=fine-tune-results&limit=100").await;
    let mut listed: Vec<String> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    published.sort();
    assert_eq!(listed, published);
}

/// Uploads an adapter's two PEFT files as `key`; returns their ids.
async fn upload_peft(state: &AppState, key: &str, adapter: &LoraAdapter) -> (String, String) {
    let (weights, config) = adapter.to_peft().unwrap();
    let mut ids = Vec::new();
    for (name, bytes) in [
        ("adapter_model.safetensors", weights),
        ("adapter_config.json", config.into_bytes()),
    ] {
        let reply = upload_as(state, key, "/v1/files", "user_data", name, &bytes).await;
        reply.expect_status(200);
        ids.push(reply.json()["id"].as_str().unwrap().to_string());
    }
    (ids[0].clone(), ids[1].clone())
}

fn import_body(name: &str, files: &(String, String)) -> Value {
    json!({"base_model": MODEL, "name": name, "weights_file": files.0, "config_file": files.1})
}

fn zero_b(mut a: LoraAdapter) -> LoraAdapter {
    for layer in &mut a.layers {
        for w in layer.values_mut() {
            w.b = w.b.zeros_like().unwrap();
        }
    }
    a
}

#[tokio::test]
async fn an_imported_adapter_serves_its_project_only() {
    let state = state();
    let admin = state
        .store
        .create_key("admin", None, true)
        .await
        .unwrap()
        .secret;
    let (other_project, other_key) = raw::other_project(&state).await;
    let good = upload_peft(&state, KEY, &adapter(5, 192)).await;

    // Refused, each with a clear 400 naming the field; nothing registered.
    let refusals: Vec<(Value, &str, &str)> = vec![
        (import_body("bad name", &good), "name", "letters"),
        (
            json!({"base_model": "nobody/unknown", "name": "x",
            "weights_file": good.0, "config_file": good.1}),
            "base_model",
            "nobody/unknown",
        ),
        (
            json!({"base_model": MODEL, "name": "x", "weights_file": "file-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "config_file": good.1}),
            "weights_file",
            "does not exist",
        ),
        (
            json!({"base_model": MODEL, "name": "x", "project_id": "project-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "weights_file": good.0, "config_file": good.1}),
            "project_id",
            "does not exist",
        ),
        // The files are the default project's, not the other one's.
        (
            json!({"base_model": MODEL, "name": "x", "project_id": other_project,
            "weights_file": good.0, "config_file": good.1}),
            "weights_file",
            "does not exist",
        ),
        (
            json!({"base_model": MODEL, "name": "x", "weights_file": good.0,
            "config_file": good.0}),
            "config_file",
            "UTF-8",
        ),
    ];
    for (body, param, words) in refusals {
        let reply = call(
            &state,
            "POST",
            "/v1/admin/adapters",
            &admin,
            Some(body.clone()),
        )
        .await;
        let message = shape_b_param(&reply, Some(param));
        assert!(message.contains(words), "{body}: {message}");
    }
    // v's B with 100 rows where the model's v projection has 192.
    let wrong = upload_peft(&state, KEY, &adapter(5, 100)).await;
    let reply = call(
        &state,
        "POST",
        "/v1/admin/adapters",
        &admin,
        Some(import_body("w", &wrong)),
    )
    .await;
    let message = shape_b_param(&reply, Some("weights_file"));
    assert!(
        message.contains("v_proj") && message.contains("192"),
        "{message}"
    );
    // Not an admin key: 403.
    let reply = call(
        &state,
        "POST",
        "/v1/admin/adapters",
        KEY,
        Some(import_body("x", &good)),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", raw::text(&reply));
    let models = ok_json(&state, "/v1/models").await;
    assert!(!models.to_string().contains(":adapter-"), "{models}");

    // Imported: served as `<base>:<name>:<id>`, differently from the base.
    let reply = call(
        &state,
        "POST",
        "/v1/admin/adapters",
        &admin,
        Some(import_body("colours", &good)),
    )
    .await;
    reply.expect_status(200);
    let imported = reply.json();
    let model = imported["model"].as_str().unwrap().to_string();
    let id = imported["id"].as_str().unwrap();
    assert_eq!(model, format!("{MODEL}:colours:{id}"));
    assert_eq!(
        (imported["r"].clone(), imported["project_id"].clone()),
        (json!(8), json!(state.default_project.to_string()))
    );
    assert_eq!(imported["target_modules"], json!(["q_proj", "v_proj"]));
    let base = answer(&state, MODEL).await;
    let tuned = answer(&state, &model).await;
    assert_ne!(tuned, base, "the adapter changed nothing");
    let reply = chat(&state, KEY, &model).await;
    assert_eq!(reply.json()["model"], model.as_str());
    // The name is taken now.
    let reply = call(
        &state,
        "POST",
        "/v1/admin/adapters",
        &admin,
        Some(import_body("colours", &good)),
    )
    .await;
    assert!(shape_b_param(&reply, Some("name")).contains("already"));

    // With B zero the adapter adds nothing: the base's greedy answer.
    let zero = upload_peft(&state, KEY, &zero_b(adapter(5, 192))).await;
    let reply = call(
        &state,
        "POST",
        "/v1/admin/adapters",
        &admin,
        Some(import_body("zero", &zero)),
    )
    .await;
    reply.expect_status(200);
    let zero_model = reply.json()["model"].as_str().unwrap().to_string();
    assert_eq!(answer(&state, &zero_model).await, base);

    // Listed for its project, with the base as parent; unknown elsewhere.
    let models = ok_json(&state, "/v1/models").await;
    let listed = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == model.as_str());
    assert_eq!(
        listed.unwrap_or_else(|| panic!("{models}"))["parent"],
        MODEL
    );
    let theirs = raw::get(&state, "/v1/models", Some(&other_key))
        .await
        .json();
    assert!(!theirs.to_string().contains(id), "{theirs}");
    // Retrieved by id the same way: its project's, a 404 elsewhere.
    let one = ok_json(&state, &format!("/v1/models/{model}")).await;
    assert_eq!(Some(&one), listed);
    let reply = raw::get(&state, &format!("/v1/models/{model}"), Some(&other_key)).await;
    assert_eq!(reply.status, 404, "{}", raw::text(&reply));
    let reply = chat(&state, &other_key, &model).await;
    assert_eq!(reply.status, 404, "{}", raw::text(&reply));

    // The admin list, then delete: no longer served.
    let list = call(&state, "GET", "/v1/admin/adapters", &admin, None)
        .await
        .json();
    assert_eq!(list["data"].as_array().unwrap().len(), 2, "{list}");
    let reply = call(
        &state,
        "DELETE",
        &format!("/v1/admin/adapters/{id}"),
        &admin,
        None,
    )
    .await;
    reply.expect_status(200);
    assert_eq!(reply.json()["deleted"], true);
    assert_eq!(chat(&state, KEY, &model).await.status, 404);
    let reply = call(
        &state,
        "DELETE",
        &format!("/v1/admin/adapters/{id}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(reply.status, 403, "{}", raw::text(&reply));
}

/// `hearth models import-adapter` on a store in `dir`.
fn import_cli(
    dir: &std::path::Path,
    folder: &std::path::Path,
    name: &str,
    project: &str,
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["models", "import-adapter"])
        .arg(folder)
        .args(["--base", MODEL, "--name", name, "--project", project])
        .args(["--catalog", "/nonexistent/catalog.toml", "--data-dir"])
        .arg(data_dir())
        .args(store_flags(dir))
        .output()
        .expect("running hearth")
}

#[tokio::test]
async fn the_cli_imports_a_peft_folder_for_a_project() {
    let dir = temp_dir();
    let store = hearth_store::Store::open(&hearth_store::StoreConfig {
        data_dir: dir.clone(),
        database_url: Some(format!("sqlite://{}", dir.join("hearth.db").display())),
        blob_url: Some(format!("file://{}", dir.join("blobs").display())),
    })
    .await
    .unwrap();
    let project = store.create_project("cli").await.unwrap().id;
    adapter(9, 192).save_dir(&dir.join("good")).unwrap();
    adapter(9, 100).save_dir(&dir.join("wrong")).unwrap();

    // The shapes the CLI checks against, read from the GGUF's header alone,
    // are those of the loaded model.
    let entry = &with_model().chat[MODEL].entry;
    let models = data_dir().join("models");
    let read = hearth_engine::adapters::base_lora_spec(entry, &models).unwrap();
    let loaded =
        hearth_engine::load::load_gguf(&entry.weights_path(&models), &hearth_engine::Device::Cpu)
            .unwrap()
            .model
            .lora_spec()
            .unwrap();
    assert_eq!(format!("{:?}", read.info), format!("{:?}", loaded.info));
    assert_eq!(
        (read.intermediate_size, read.gguf_layout),
        (loaded.intermediate_size, loaded.gguf_layout)
    );

    let wrong = import_cli(&dir, &dir.join("wrong"), "w", &project);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && stderr.contains("v_proj"),
        "{stderr}"
    );
    let missing = import_cli(&dir, &dir.join("nothing"), "m", &project);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && stderr.contains("adapter_model.safetensors"),
        "{stderr}"
    );

    let done = import_cli(&dir, &dir.join("good"), "cli-colours", &project);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let model = String::from_utf8(done.stdout).unwrap().trim().to_string();
    assert!(
        model.starts_with(&format!("{MODEL}:cli-colours:adapter-")),
        "{model}"
    );
    let again = import_cli(&dir, &dir.join("good"), "cli-colours", &project);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && stderr.contains("already"),
        "{stderr}"
    );

    // Served to that project (the extra key's here) by a server on the store.
    let state = AppState {
        adapter_source: Some(std::sync::Arc::new(
            hearth_server::fine_tuned::FineTunedModels {
                store: store.clone(),
            },
        )),
        store,
        default_project: project.into(),
        ..with_model()
    };
    assert_ne!(answer(&state, &model).await, answer(&state, MODEL).await);
}
