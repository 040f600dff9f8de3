//! Fine-tuning jobs and their models through the in-process router, on the
//! default model: the job list's metadata filter, the learning-rate
//! multiplier a job shows, a checkpoint's model retrieved like any served
//! model, and a fine-tuned model deleted.

mod common;
mod console_common;

use common::lora::adapter;
use common::raw::{self, shape_b_param, upload, Raw};
use common::*;
use hearth_server::AppState;
use serde_json::{json, Value};

/// The default model's state on a fresh store of its own, serving the
/// store's fine-tuned models.
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

const CHAT_LINES: &str = concat!(
    r#"{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}"#,
    "\n",
);

async fn training_file(state: &AppState) -> String {
    let file = upload(state, "fine-tune", CHAT_LINES.as_bytes()).await;
    file["id"].as_str().unwrap().to_string()
}

async fn call(state: &AppState, method: &str, uri: &str, body: Option<Value>) -> Raw {
    raw::call(state, method, uri, KEY, body).await
}

async fn ok_json(state: &AppState, method: &str, uri: &str, body: Option<Value>) -> Value {
    let reply = call(state, method, uri, body).await;
    assert_eq!(reply.status, 200, "{uri}: {}", raw::text(&reply));
    reply.json()
}

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect()
}

/// `uri` with its brackets escaped, as the SDK sends them.
fn escaped(uri: &str) -> String {
    uri.replace('[', "%5B").replace(']', "%5D")
}

async fn jobs(state: &AppState, query: &str) -> Value {
    let uri = escaped(&format!("/v1/fine_tuning/jobs?{query}"));
    ok_json(state, "GET", &uri, None).await
}

#[tokio::test]
async fn jobs_list_by_metadata_with_paging() {
    let state = state();
    let file = training_file(&state).await;
    let mut qa = Vec::new();
    for i in 0..3 {
        for who in ["qa2", "dev"] {
            let body = json!({"model": MODEL, "training_file": file,
                "metadata": {"who": who, "n": i.to_string()}});
            let job = ok_json(&state, "POST", "/v1/fine_tuning/jobs", Some(body)).await;
            if who == "qa2" {
                qa.push(job["id"].as_str().unwrap().to_string());
            }
        }
    }
    qa.reverse();
    let all = jobs(&state, "metadata[who]=qa2").await;
    assert_eq!(
        (ids(&all), all["has_more"].as_bool()),
        (qa.clone(), Some(false))
    );
    let page = jobs(&state, "metadata[who]=qa2&limit=2").await;
    assert_eq!(
        (ids(&page), page["has_more"].as_bool()),
        (qa[..2].to_vec(), Some(true))
    );
    let page = jobs(
        &state,
        &format!("metadata[who]=qa2&limit=2&after={}", qa[1]),
    )
    .await;
    assert_eq!(
        (ids(&page), page["has_more"].as_bool()),
        (qa[2..].to_vec(), Some(false))
    );
    // Every pair must match.
    let one = jobs(&state, "metadata[who]=qa2&metadata[n]=1").await;
    assert_eq!(ids(&one), vec![qa[1].clone()]);
    let none = jobs(&state, "metadata[who]=nobody").await;
    assert_eq!(none["data"], json!([]));
    // Malformed filters: 400 naming `metadata`.
    for bad in [
        "metadata=qa2",
        "metadata[]=qa2",
        "metadata[a][b]=x",
        "metadata[who=x",
    ] {
        let uri = escaped(&format!("/v1/fine_tuning/jobs?{bad}"));
        let reply = call(&state, "GET", &uri, None).await;
        shape_b_param(&reply, Some("metadata"));
    }
}

#[tokio::test]
async fn jobs_show_the_learning_rate_multiplier() {
    let state = state();
    let file = training_file(&state).await;
    let cases = [
        (
            json!({"hyperparameters": {"learning_rate_multiplier": 2}}),
            2.0,
        ),
        (
            json!({"method": {"type": "supervised", "supervised": {"hyperparameters":
                {"learning_rate_multiplier": 0.5}}}}),
            0.5,
        ),
        (
            json!({"hyperparameters": {"learning_rate_multiplier": "auto"}}),
            1.0,
        ),
        (json!({}), 1.0),
        (json!({"hyperparameters": {"learning_rate": 3e-4}}), 3.0),
    ];
    for (extra, multiplier) in cases {
        let mut body = json!({"model": MODEL, "training_file": file});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let created = ok_json(&state, "POST", "/v1/fine_tuning/jobs", Some(body)).await;
        let id = created["id"].as_str().unwrap();
        let got = ok_json(&state, "GET", &format!("/v1/fine_tuning/jobs/{id}"), None).await;
        for job in [&created, &got] {
            for hp in [
                &job["hyperparameters"],
                &job["method"]["supervised"]["hyperparameters"],
            ] {
                let m = hp["learning_rate_multiplier"].as_f64().unwrap_or(f64::NAN);
                assert!((m - multiplier).abs() < 1e-9, "{extra}: {hp}");
                let lr = hp["learning_rate"].as_f64().unwrap();
                assert!((lr - multiplier * 1e-4).abs() < 1e-12, "{extra}: {hp}");
            }
        }
    }
}

/// A succeeded job of the default project as a worker leaves it: a
/// checkpoint at step 5 with its PEFT files, the model `name`.
async fn succeeded_job(state: &AppState, name: &str) -> String {
    let file = training_file(state).await;
    let body = json!({"model": MODEL, "training_file": file});
    let job = ok_json(state, "POST", "/v1/fine_tuning/jobs", Some(body)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let store = &state.store;
    store
        .claim_ft_job(&hearth_store::ClaimRules::new("test-worker", 60))
        .await
        .unwrap()
        .unwrap();
    let prefix = format!("{}/step-000005", hearth_store::ft_blob_prefix(&id));
    let (weights, config) = adapter(3, 192).to_peft().unwrap();
    let blobs = store.blobs();
    blobs
        .put(&format!("{prefix}/adapter_model.safetensors"), &weights)
        .await
        .unwrap();
    blobs
        .put(&format!("{prefix}/adapter_config.json"), config.as_bytes())
        .await
        .unwrap();
    store
        .add_ft_checkpoint(
            &id,
            5,
            &format!("{name}:ckpt-step-5"),
            json!({"step": 5}),
            &prefix,
        )
        .await
        .unwrap();
    assert!(store
        .finish_ft_job(
            &id,
            "test-worker",
            hearth_store::FtStatus::Succeeded,
            Some(name),
            &[],
            None
        )
        .await
        .unwrap());
    id
}

async fn chat_status(state: &AppState, model: &str) -> u16 {
    let body = json!({"model": model, "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]});
    call(state, "POST", "/v1/chat/completions", Some(body))
        .await
        .status
}

#[tokio::test]
async fn checkpoints_retrieve_and_fine_tuned_models_delete() {
    let state = state();
    let name = format!("{MODEL}:mine:ftjob-01JTESTJOB0000000000000000");
    let job_id = succeeded_job(&state, &name).await;
    let ckpt = format!("{name}:ckpt-step-5");
    // The console's playground offers the fine-tuned model (not its
    // checkpoints, as the list).
    let (mut browser, _) = console_common::signed_in(&state, "pg").await;
    let playground = browser.get("/console/playground").await.text;
    assert!(
        playground.contains(&format!(r#"<option value="{name}""#)),
        "{playground}"
    );
    assert!(!playground.contains(&ckpt), "{playground}");
    // The checkpoint is served, and retrieved though not listed.
    assert_eq!(chat_status(&state, &ckpt).await, 200);
    let listed = ids(&ok_json(&state, "GET", "/v1/models", None).await);
    assert!(
        listed.contains(&name) && !listed.contains(&ckpt),
        "{listed:?}"
    );
    let model = ok_json(&state, "GET", &format!("/v1/models/{ckpt}"), None).await;
    assert_eq!(
        (
            model["id"].as_str(),
            model["object"].as_str(),
            model["parent"].as_str()
        ),
        (Some(ckpt.as_str()), Some("model"), Some(MODEL))
    );
    let verbose = ok_json(
        &state,
        "GET",
        &format!("/v1/models/{ckpt}?verbose=true"),
        None,
    )
    .await;
    assert_eq!(verbose["kind"], "adapter", "{verbose}");
    raw::shape_a(
        &call(
            &state,
            "GET",
            &format!("/v1/models/{name}:ckpt-step-6"),
            None,
        )
        .await,
        404,
    );

    // Base models cannot be deleted; unknown names are 404.
    raw::shape_a(
        &call(&state, "DELETE", &format!("/v1/models/{MODEL}"), None).await,
        403,
    );
    raw::shape_a(
        &call(&state, "DELETE", "/v1/models/no-such-model", None).await,
        404,
    );
    // Another project does not know the model.
    let (_, other_key) = raw::other_project(&state).await;
    let reply = raw::call(
        &state,
        "DELETE",
        &format!("/v1/models/{name}"),
        &other_key,
        None,
    )
    .await;
    raw::shape_a(&reply, 404);

    let deleted = ok_json(&state, "DELETE", &format!("/v1/models/{name}"), None).await;
    assert_eq!(
        deleted,
        json!({"id": name, "object": "model", "deleted": true})
    );
    // Gone for inference, the list and retrieve, with its checkpoints.
    for gone in [&name, &ckpt] {
        assert_eq!(chat_status(&state, gone).await, 404, "{gone}");
        raw::shape_a(
            &call(&state, "GET", &format!("/v1/models/{gone}"), None).await,
            404,
        );
    }
    let listed = ids(&ok_json(&state, "GET", "/v1/models", None).await);
    assert!(!listed.contains(&name), "{listed:?}");
    let playground = browser.get("/console/playground").await.text;
    assert!(!playground.contains(&name), "{playground}");
    raw::shape_a(
        &call(&state, "DELETE", &format!("/v1/models/{name}"), None).await,
        404,
    );
    // The job keeps its model's name.
    let job = ok_json(
        &state,
        "GET",
        &format!("/v1/fine_tuning/jobs/{job_id}"),
        None,
    )
    .await;
    assert_eq!(
        (job["status"].as_str(), job["fine_tuned_model"].as_str()),
        (Some("succeeded"), Some(name.as_str()))
    );
}
