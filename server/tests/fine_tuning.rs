//! `/v1/fine_tuning` through the in-process router, with the default chat
//! model loaded: job creation (defaults filled, every check before a job
//! exists), list, retrieve, cancel, events, checkpoints, the spec-draft
//! model list, project scoping, and files held by jobs.

mod common;

use common::raw::{self, shape_b_param, upload, Raw};
use common::*;
use serde_json::{json, Value};

/// The default model's state on a fresh store of its own (the model is
/// loaded once per test binary; each test gets its own jobs and files).
fn state() -> hearth_server::AppState {
    let (store, project) = new_store();
    hearth_server::AppState {
        store,
        default_project: project.into(),
        ..with_model()
    }
}

const CHAT_LINES: &str = concat!(
    r#"{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}"#,
    "\n",
    r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}"#,
    "\n",
);

async fn training_file(state: &hearth_server::AppState) -> String {
    let file = upload(state, "fine-tune", CHAT_LINES.as_bytes()).await;
    assert_eq!(file["status"], "processed", "{file}");
    file["id"].as_str().unwrap().to_string()
}

async fn send_as(
    state: &hearth_server::AppState,
    method: &str,
    uri: &str,
    key: &str,
    body: Option<&Value>,
) -> Raw {
    let (ct, bytes) = match body {
        Some(b) => (Some("application/json"), b.to_string().into_bytes()),
        None => (None, Vec::new()),
    };
    raw::request(state, method, uri, Some(key), ct, bytes).await
}

async fn create(state: &hearth_server::AppState, body: Value) -> Raw {
    send_as(state, "POST", "/v1/fine_tuning/jobs", KEY, Some(&body)).await
}

async fn get_json(state: &hearth_server::AppState, uri: &str) -> Value {
    let reply = send_as(state, "GET", uri, KEY, None).await;
    assert_eq!(
        reply.status,
        200,
        "{uri}: {}",
        String::from_utf8_lossy(&reply.bytes)
    );
    reply.json()
}

#[tokio::test]
async fn metadata_is_kept_with_the_job_and_bounded() {
    let state = state();
    let file = training_file(&state).await;
    let metadata = json!({"team": "search", "ticket": "T-42"});
    let body = json!({"model": MODEL, "training_file": file, "metadata": metadata});
    let job = create(&state, body).await.json();
    assert_eq!(job["metadata"], metadata, "{job}");
    let id = job["id"].as_str().unwrap();
    let stored = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}")).await;
    assert_eq!(stored["metadata"], metadata);
    let list = get_json(&state, "/v1/fine_tuning/jobs").await;
    assert_eq!(list["data"][0]["metadata"], metadata);
    // OpenAI's bounds: 16 pairs, keys of 64 and values of 512 characters.
    let pairs: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (bad, needle) in [
        (Value::Object(pairs), "16"),
        (json!({"k".repeat(65): "v"}), "64"),
        (json!({"k": "v".repeat(513)}), "512"),
    ] {
        let body = json!({"model": MODEL, "training_file": file, "metadata": bad});
        let reply = create(&state, body).await;
        assert!(shape_b_param(&reply, Some("metadata")).contains(needle));
    }
    // Values must be strings: 422.
    let body = json!({"model": MODEL, "training_file": file, "metadata": {"n": 1}});
    let item = raw::shape_c(&create(&state, body).await);
    assert_eq!(item["loc"], json!(["body", "metadata", "n"]), "{item}");
    let list = get_json(&state, "/v1/fine_tuning/jobs").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
}

#[tokio::test]
async fn create_fills_defaults_then_list_get_cancel_and_events() {
    let state = state();
    let file = training_file(&state).await;
    let reply = create(&state, json!({"model": MODEL, "training_file": file})).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
    let job = reply.json();
    let id = job["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ftjob-"), "{job}");
    assert_eq!(job["object"], "fine_tuning.job");
    assert_eq!(job["model"], MODEL);
    assert_eq!(job["status"], "queued");
    assert_eq!(job["organization_id"], state.default_project.as_ref());
    assert_eq!(job["training_file"], file.as_str());
    assert!(job["validation_file"].is_null() && job["suffix"].is_null());
    assert!(job["created_at"].is_i64() && job["finished_at"].is_null());
    assert!(job["fine_tuned_model"].is_null() && job["error"].is_null());
    assert!(job["estimated_finish"].is_null() && job["trained_tokens"].is_null());
    assert_eq!(job["trained_steps"], 0);
    assert_eq!(job["result_files"], json!([]));
    assert_eq!(job["integrations"], json!([]));
    assert!(job["metadata"].is_null(), "{job}");
    assert!(
        job["seed"].is_i64(),
        "a random seed is chosen and shown: {job}"
    );
    let defaults = json!({
        "n_epochs": 3, "batch_size": 8, "learning_rate": 1e-4,
        "learning_rate_multiplier": 1.0, "warmup_ratio": 0.0,
        "weight_decay": 0.0, "max_grad_norm": 1.0, "packing": true, "context_length": 1024,
        "lora": true, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
    });
    assert_eq!(job["hyperparameters"], defaults);
    assert_eq!(
        job["method"],
        json!({"type": "supervised", "supervised": {"hyperparameters": defaults}})
    );
    // The job was stored as shown.
    assert_eq!(
        get_json(&state, &format!("/v1/fine_tuning/jobs/{id}")).await,
        job
    );
    let list = get_json(&state, "/v1/fine_tuning/jobs").await;
    assert_eq!(
        list,
        json!({"object": "list", "data": [job], "has_more": false})
    );

    // Its training file is in use while the job is not over.
    let deleting = send_as(&state, "DELETE", &format!("/v1/files/{file}"), KEY, None).await;
    assert_eq!(
        deleting.status,
        409,
        "{}",
        String::from_utf8_lossy(&deleting.bytes)
    );
    assert!(deleting.json()["detail"].as_str().unwrap().contains(&id));

    // Events: the creation.
    let events = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}/events")).await;
    assert_eq!(events["object"], "list");
    assert_eq!(events["has_more"], false);
    let first = &events["data"][0];
    assert_eq!(first["object"], "fine_tuning.job.event");
    assert_eq!(first["message"], "Created fine-tuning job");
    assert_eq!(
        (first["level"].as_str(), first["type"].as_str()),
        (Some("info"), Some("message"))
    );
    assert!(first["id"].as_str().unwrap().starts_with("ftevent-") && first["created_at"].is_i64());
    assert!(first["data"].is_null());

    // Checkpoints: none yet.
    let checkpoints = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}/checkpoints")).await;
    assert_eq!(
        checkpoints,
        json!({"object": "list", "data": [], "has_more": false})
    );
    raw::shape_a(
        &send_as(
            &state,
            "GET",
            &format!("/v1/fine_tuning/jobs/{id}/checkpoints/ftckpt-01J00000000000000000000000"),
            KEY,
            None,
        )
        .await,
        403,
    );

    // Cancel: immediate; again: the same job.
    let cancel_uri = format!("/v1/fine_tuning/jobs/{id}/cancel");
    let cancelled = send_as(&state, "POST", &cancel_uri, KEY, None).await;
    assert_eq!(
        cancelled.status,
        200,
        "{}",
        String::from_utf8_lossy(&cancelled.bytes)
    );
    let cancelled = cancelled.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["finished_at"].is_i64());
    let again = send_as(&state, "POST", &cancel_uri, KEY, None).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json(), cancelled);
    assert_eq!(
        get_json(&state, &format!("/v1/fine_tuning/jobs/{id}")).await,
        cancelled
    );
    let events = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}/events")).await;
    let messages: Vec<_> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        messages,
        vec!["Fine-tuning job cancelled", "Created fine-tuning job"]
    );
    let page = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}/events?limit=1")).await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["message"], "Fine-tuning job cancelled");
    let after = page["data"][0]["id"].as_str().unwrap();
    let page = get_json(
        &state,
        &format!("/v1/fine_tuning/jobs/{id}/events?limit=1&after={after}"),
    )
    .await;
    assert_eq!(page["has_more"], false);
    assert_eq!(page["data"][0]["message"], "Created fine-tuning job");

    // The job is over: its file may go.
    let deleting = send_as(&state, "DELETE", &format!("/v1/files/{file}"), KEY, None).await;
    assert_eq!(
        deleting.status,
        200,
        "{}",
        String::from_utf8_lossy(&deleting.bytes)
    );
}

#[tokio::test]
async fn given_values_are_kept_and_jobs_page_newest_first() {
    let state = state();
    let file = training_file(&state).await;
    let validation = training_file(&state).await;
    let job = create(
        &state,
        json!({
            "model": MODEL, "training_file": file, "validation_file": validation,
            "suffix": "my-model_v1.0", "seed": 1234,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": "auto", "batch_size": 2, "learning_rate_multiplier": 2,
                "context_length": 512, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.1,
                "packing": false, "max_grad_norm": 0}}},
            "integrations": [], "metadata": {"k": "v"},
        }),
    )
    .await;
    assert_eq!(job.status, 200, "{}", String::from_utf8_lossy(&job.bytes));
    let job = job.json();
    assert_eq!(job["seed"], 1234);
    assert_eq!(job["suffix"], "my-model_v1.0");
    assert_eq!(job["validation_file"], validation.as_str());
    let hp = &job["hyperparameters"];
    assert_eq!(hp["n_epochs"], 3);
    assert_eq!(hp["batch_size"], 2);
    assert!(
        (hp["learning_rate"].as_f64().unwrap() - 2e-4).abs() < 1e-12,
        "{hp}"
    );
    assert_eq!(hp["context_length"], 512);
    assert_eq!(
        (hp["lora_r"].as_i64(), hp["lora_alpha"].as_i64()),
        (Some(16), Some(32))
    );
    assert_eq!(hp["lora_dropout"], 0.1);
    assert_eq!(hp["packing"], false);
    assert_eq!(hp["max_grad_norm"], 0.0);
    // Either file of a queued job is in use.
    let deleting = send_as(
        &state,
        "DELETE",
        &format!("/v1/files/{validation}"),
        KEY,
        None,
    )
    .await;
    assert_eq!(deleting.status, 409);

    let mut ids = vec![job["id"].as_str().unwrap().to_string()];
    for _ in 0..2 {
        let reply = create(&state, json!({"model": MODEL, "training_file": file})).await;
        assert_eq!(reply.status, 200);
        ids.push(reply.json()["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let listed = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_string())
            .collect()
    };
    let page = get_json(&state, "/v1/fine_tuning/jobs?limit=2").await;
    assert_eq!(
        (listed(&page), page["has_more"].as_bool()),
        (ids[..2].to_vec(), Some(true))
    );
    let page = get_json(
        &state,
        &format!("/v1/fine_tuning/jobs?limit=2&after={}", ids[1]),
    )
    .await;
    assert_eq!(
        (listed(&page), page["has_more"].as_bool()),
        (ids[2..].to_vec(), Some(false))
    );
    let page = get_json(&state, "/v1/fine_tuning/jobs?after=").await;
    assert_eq!(listed(&page), ids);
}

#[tokio::test]
async fn every_bad_request_is_refused_before_a_job_exists() {
    let state = state();
    let file = training_file(&state).await;
    let (_, other_key) = raw::other_project(&state).await;
    let theirs = raw::upload_as(
        &state,
        &other_key,
        "/v1/files",
        "fine-tune",
        "t.jsonl",
        CHAT_LINES.as_bytes(),
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let wrong_purpose = upload(&state, "user_data", CHAT_LINES.as_bytes()).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Valid JSONL (so `processed`), but not a training example on line 2.
    let bad_line = upload(
        &state,
        "fine-tune",
        format!(
            "{}{}\n",
            CHAT_LINES.lines().next().unwrap().to_owned() + "\n",
            r#"{"text": "x"}"#
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(bad_line["status"], "processed");
    let bad_line = bad_line["id"].as_str().unwrap().to_string();
    // Not JSONL at all: the file is `error`.
    let broken = upload(&state, "fine-tune", b"{\"messages\": []}\nnot json\n").await;
    assert_eq!(broken["status"], "error");
    let broken = broken["id"].as_str().unwrap().to_string();

    let base = json!({"model": MODEL, "training_file": file});
    let with = |extra: Value| {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let hp = |name: &str, value: Value| with(json!({"hyperparameters": {name: value}}));
    let cases: Vec<(Value, Option<&str>, &str)> = vec![
        (
            with(json!({"model": "no-such/model"})),
            Some("model"),
            "does not exist",
        ),
        (
            with(json!({"model": "sentence-transformers/all-MiniLM-L6-v2"})),
            Some("model"),
            "cannot be fine-tuned",
        ),
        (
            with(json!({"training_file": "file-missing"})),
            Some("training_file"),
            "does not exist",
        ),
        (
            with(json!({"training_file": theirs})),
            Some("training_file"),
            "does not exist",
        ),
        (
            with(json!({"training_file": wrong_purpose})),
            Some("training_file"),
            "purpose",
        ),
        (
            with(json!({"training_file": bad_line})),
            Some("training_file"),
            "line 2",
        ),
        (
            with(json!({"training_file": broken})),
            Some("training_file"),
            "line 2",
        ),
        (
            with(json!({"validation_file": "file-missing"})),
            Some("validation_file"),
            "does not exist",
        ),
        (
            with(json!({"validation_file": bad_line})),
            Some("validation_file"),
            "line 2",
        ),
        (
            with(json!({"suffix": "x".repeat(65)})),
            Some("suffix"),
            "64",
        ),
        (
            with(json!({"suffix": "no spaces"})),
            Some("suffix"),
            "letters",
        ),
        (
            hp("lora", json!(false)),
            Some("hyperparameters.lora"),
            "only LoRA fine-tuning is supported",
        ),
        (
            hp("n_epochs", json!(0)),
            Some("hyperparameters.n_epochs"),
            "between",
        ),
        (
            hp("n_epochs", json!(101)),
            Some("hyperparameters.n_epochs"),
            "between",
        ),
        (
            hp("batch_size", json!(0)),
            Some("hyperparameters.batch_size"),
            "between",
        ),
        (
            hp("batch_size", json!(257)),
            Some("hyperparameters.batch_size"),
            "between",
        ),
        (
            hp("learning_rate", json!(0)),
            Some("hyperparameters.learning_rate"),
            "above 0",
        ),
        (
            hp("learning_rate", json!(2)),
            Some("hyperparameters.learning_rate"),
            "at most 1",
        ),
        (
            hp("learning_rate_multiplier", json!(0)),
            Some("hyperparameters.learning_rate_multiplier"),
            "above 0",
        ),
        (
            hp("warmup_ratio", json!(1.5)),
            Some("hyperparameters.warmup_ratio"),
            "between",
        ),
        (
            hp("weight_decay", json!(-0.5)),
            Some("hyperparameters.weight_decay"),
            "between",
        ),
        (
            hp("max_grad_norm", json!(-1)),
            Some("hyperparameters.max_grad_norm"),
            "at least 0",
        ),
        (
            hp("context_length", json!(4)),
            Some("hyperparameters.context_length"),
            "between",
        ),
        (
            hp("context_length", json!(8193)),
            Some("hyperparameters.context_length"),
            "8192",
        ),
        (
            hp("lora_r", json!(0)),
            Some("hyperparameters.lora_r"),
            "between",
        ),
        (
            hp("lora_r", json!(257)),
            Some("hyperparameters.lora_r"),
            "between",
        ),
        (
            hp("lora_alpha", json!(0)),
            Some("hyperparameters.lora_alpha"),
            "between",
        ),
        (
            hp("lora_alpha", json!(1025)),
            Some("hyperparameters.lora_alpha"),
            "between",
        ),
        (
            hp("lora_dropout", json!(1)),
            Some("hyperparameters.lora_dropout"),
            "below 1",
        ),
        (
            hp("lora_dropout", json!(-0.1)),
            Some("hyperparameters.lora_dropout"),
            "at least 0",
        ),
        (
            with(json!({"method": {"type": "dpo"}})),
            Some("method.type"),
            "supervised",
        ),
        (
            with(
                json!({"hyperparameters": {}, "method": {"type": "supervised",
                "supervised": {"hyperparameters": {"n_epochs": 2}}}}),
            ),
            Some("hyperparameters"),
            "not both",
        ),
    ];
    for (body, param, needle) in cases {
        let reply = create(&state, body.clone()).await;
        let message = shape_b_param(&reply, param);
        assert!(message.contains(needle), "{body}: {message}");
    }
    // Wrong JSON types and missing fields: 422 shape C.
    let type_cases = [
        (
            json!({"training_file": file}),
            json!(["body", "model"]),
            "missing",
        ),
        (
            json!({"model": MODEL}),
            json!(["body", "training_file"]),
            "missing",
        ),
        (
            with(json!({"seed": "abc"})),
            json!(["body", "seed"]),
            "int_type",
        ),
        (
            hp("n_epochs", json!("many")),
            json!(["body", "hyperparameters", "n_epochs"]),
            "value_error",
        ),
        (
            hp("batch_size", json!(2.5)),
            json!(["body", "hyperparameters", "batch_size"]),
            "value_error",
        ),
        (
            hp("learning_rate", json!("fast")),
            json!(["body", "hyperparameters", "learning_rate"]),
            "float_type",
        ),
        (
            hp("packing", json!("yes")),
            json!(["body", "hyperparameters", "packing"]),
            "bool_type",
        ),
        (
            hp("lora_r", json!(1.5)),
            json!(["body", "hyperparameters", "lora_r"]),
            "int_type",
        ),
        (
            hp("lora_rank", json!(16)),
            json!(["body", "hyperparameters", "lora_rank"]),
            "extra_forbidden",
        ),
    ];
    for (body, loc, kind) in type_cases {
        let item = raw::shape_c(&create(&state, body.clone()).await);
        assert_eq!(
            (&item["loc"], item["type"].as_str()),
            (&loc, Some(kind)),
            "{body}: {item}"
        );
    }
    // None of these made a job.
    let list = get_json(&state, "/v1/fine_tuning/jobs").await;
    assert_eq!(list["data"], json!([]));
    // Bad list queries: 422 shape C.
    for uri in [
        "/v1/fine_tuning/jobs?limit=abc",
        "/v1/fine_tuning/jobs?limit=0",
        "/v1/fine_tuning/jobs?limit=1001",
    ] {
        let item = raw::shape_c(&send_as(&state, "GET", uri, KEY, None).await);
        assert_eq!(item["loc"], json!(["query", "limit"]), "{uri}");
    }
}

#[tokio::test]
async fn other_projects_jobs_are_403_and_finished_jobs_cannot_be_cancelled() {
    let state = state();
    let file = training_file(&state).await;
    let job = create(&state, json!({"model": MODEL, "training_file": file}))
        .await
        .json();
    let id = job["id"].as_str().unwrap().to_string();
    let (other, other_key) = raw::other_project(&state).await;
    for (method, uri) in [
        ("GET", format!("/v1/fine_tuning/jobs/{id}")),
        ("POST", format!("/v1/fine_tuning/jobs/{id}/cancel")),
        ("GET", format!("/v1/fine_tuning/jobs/{id}/events")),
        ("GET", format!("/v1/fine_tuning/jobs/{id}/checkpoints")),
        (
            "GET",
            format!("/v1/fine_tuning/jobs/{id}/checkpoints/ftckpt-x"),
        ),
        (
            "GET",
            "/v1/fine_tuning/jobs/ftjob-01J00000000000000000000000".to_string(),
        ),
        (
            "POST",
            "/v1/fine_tuning/jobs/ftjob-missing/cancel".to_string(),
        ),
    ] {
        raw::shape_a(&send_as(&state, method, &uri, &other_key, None).await, 403);
    }
    let theirs = get_json(
        &state,
        &format!(
            "/v1/fine_tuning/jobs?ai_project_id={}",
            state.default_project
        ),
    )
    .await;
    assert_eq!(theirs["data"][0]["id"], id.as_str());
    let list = send_as(&state, "GET", "/v1/fine_tuning/jobs", &other_key, None).await;
    assert_eq!(list.json()["data"], json!([]));
    assert_eq!(
        get_json(&state, &format!("/v1/fine_tuning/jobs/{id}")).await["status"],
        "queued",
        "the other project's cancel did nothing"
    );
    let _ = other;

    // A worker runs it to success; cancelling is then refused (400 B). The
    // store is used on the test's own runtime: a second runtime on another
    // thread, with this one blocked waiting for it, could strand pool
    // connections whose release is still queued here (seen as PoolTimedOut).
    let store = state.store.clone();
    let job_id = id.clone();
    let checkpoint = {
        let claimed = store
            .claim_ft_job(&hearth_store::ClaimRules::new("test-worker", 60))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claimed.id, job_id);
        let ckpt = store
            .add_ft_checkpoint(
                &job_id,
                10,
                "ft:smol:ckpt-step-10",
                json!({"step": 10, "train_loss": 1.5}),
                &hearth_store::ft_blob_prefix(&job_id),
            )
            .await
            .unwrap();
        assert!(store
            .finish_ft_job(
                &job_id,
                "test-worker",
                hearth_store::FtStatus::Succeeded,
                Some("ft:smol:x"),
                &[],
                None
            )
            .await
            .unwrap());
        ckpt
    };
    let reply = send_as(
        &state,
        "POST",
        &format!("/v1/fine_tuning/jobs/{id}/cancel"),
        KEY,
        None,
    )
    .await;
    let message = shape_b_param(&reply, None);
    assert!(
        message.contains("cannot cancel a job that has already succeeded"),
        "{message}"
    );
    let job = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}")).await;
    assert_eq!(
        (job["status"].as_str(), job["fine_tuned_model"].as_str()),
        (Some("succeeded"), Some("ft:smol:x"))
    );
    // Its checkpoint, listed and alone.
    let expected = json!({
        "id": checkpoint.id, "object": "fine_tuning.job.checkpoint",
        "created_at": checkpoint.created_at, "fine_tuning_job_id": id,
        "step_number": 10, "fine_tuned_model_checkpoint": "ft:smol:ckpt-step-10",
        "metrics": {"step": 10, "train_loss": 1.5},
    });
    let list = get_json(&state, &format!("/v1/fine_tuning/jobs/{id}/checkpoints")).await;
    assert_eq!(
        list,
        json!({"object": "list", "data": [expected], "has_more": false})
    );
    assert_eq!(
        get_json(
            &state,
            &format!("/v1/fine_tuning/jobs/{id}/checkpoints/{}", checkpoint.id)
        )
        .await,
        expected
    );
    raw::shape_a(
        &send_as(
            &state,
            "GET",
            &format!("/v1/fine_tuning/jobs/{id}/checkpoints/{}", checkpoint.id),
            &other_key,
            None,
        )
        .await,
        403,
    );
}

#[tokio::test]
async fn spec_draft_lists_the_default_model_at_both_paths() {
    let state = state();
    let first = get_json(&state, "/v1/fine_tuning/models/spec-draft").await;
    let second = get_json(&state, "/fine_tuning/models/spec-draft").await;
    assert_eq!(first, second);
    assert_eq!(first["object"], "list");
    let data = first["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "only chat models are trainable: {first}");
    let m = &data[0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "HuggingFaceTB");
    assert_eq!(m["context_length"], 8192);
    assert_eq!(m["price_bucket"], "small", "135M parameters");
    assert_eq!(
        m["pricing"],
        json!({"input_per_million": 0.0, "output_per_million": 0.0})
    );
    let hp = &m["hyperparameters"];
    assert_eq!(
        hp["n_epochs"],
        json!({"type": "integer", "default": 3, "min": 1, "max": 100})
    );
    assert_eq!(hp["context_length"]["max"], 8192);
    assert_eq!(hp["lora"]["default"], true);
    for path in [
        "/v1/fine_tuning/models/spec-draft",
        "/fine_tuning/models/spec-draft",
    ] {
        raw::shape_a(&raw::get(&state, path, None).await, 401);
    }
}
