//! A dataset (`dataset-...`) as a fine-tuning job's training file,
//! through the in-process router with the default chat model loaded.

mod common;

use common::raw::*;
use common::*;
use serde_json::{json, Value};

/// The default model's state on a fresh store of its own.
fn state() -> hearth_server::AppState {
    let (store, project) = new_store();
    hearth_server::AppState {
        store,
        default_project: project.into(),
        ..with_model()
    }
}

async fn create(state: &hearth_server::AppState, body: Value) -> Raw {
    call(state, "POST", "/v1/fine_tuning/jobs", KEY, Some(body)).await
}

/// A dataset (`dataset-...`) as the training file: the project's, with a
/// `messages` json column (or `prompt`/`completion`), every row an example;
/// anything else is refused before a job exists.
#[tokio::test]
async fn a_dataset_can_be_the_training_file() {
    let state = state();
    let make = |body: Value| {
        let state = state.clone();
        async move {
            let reply = call(&state, "POST", "/v1/datasets", KEY, Some(body)).await;
            assert_eq!(
                reply.status,
                200,
                "{}",
                String::from_utf8_lossy(&reply.bytes)
            );
            reply.json()["id"].as_str().unwrap().to_string()
        }
    };
    let messages = |q: &str, a: &str, role: &str| json!({"messages": [{"role": "user", "content": q}, {"role": role, "content": a}]});
    let good = make(json!({"name": "chats", "rows": [
        messages("Say hi", "hi", "assistant"), messages("2+2?", "4", "assistant")]}))
    .await;
    let pairs = make(json!({"name": "pairs", "rows": [
        {"prompt": "Say hi", "completion": "hi"}]}))
    .await;
    let columns = make(json!({"name": "text", "rows": [{"text": "just text"}]})).await;
    let bad_row = make(json!({"name": "robot", "rows": [
        messages("Say hi", "hi", "assistant"), messages("2+2?", "4", "robot")]}))
    .await;

    for dataset in [&good, &pairs] {
        let reply = create(&state, json!({"model": MODEL, "training_file": dataset})).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.bytes)
        );
        assert_eq!(reply.json()["training_file"], json!(dataset));
    }
    let message = shape_b_param(
        &create(&state, json!({"model": MODEL, "training_file": columns})).await,
        Some("training_file"),
    );
    assert!(message.contains("`messages`"), "{message}");
    let message = shape_b_param(
        &create(&state, json!({"model": MODEL, "training_file": bad_row})).await,
        Some("training_file"),
    );
    assert!(
        message.contains("line 2") && message.contains("robot"),
        "{message}"
    );
    let message = shape_b_param(
        &create(
            &state,
            json!({"model": MODEL, "training_file": "dataset-01J00000000000000000000000"}),
        )
        .await,
        Some("training_file"),
    );
    assert!(message.contains("does not exist"), "{message}");
    // A dataset in use by a queued job cannot be deleted.
    let reply = call(&state, "DELETE", &format!("/v1/datasets/{good}"), KEY, None).await;
    assert_eq!(
        reply.status,
        409,
        "{}",
        String::from_utf8_lossy(&reply.bytes)
    );
}
