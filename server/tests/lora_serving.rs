//! LoRA adapters served as chat models: a catalogue adapter entry (a PEFT
//! folder written with `LoraAdapter::save_dir`) answers /v1/chat/completions
//! on its base's engine and shows in /v1/models with `parent`/`root`; a bad
//! adapter or an unknown base fails at startup with a clear error; the
//! `AdapterSource` hook serves names the catalogue does not know.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::lora::{adapter, Jobs, FT};
use common::*;
use hearth_server::serve::build_state;
use hearth_server::AppState;

const LORA: &str = "test/smollm2-lora";

/// A catalogue file with one adapter entry over `base`, from `folder`.
fn catalogue(dir: &Path, base: &str, folder: &Path) -> std::path::PathBuf {
    let path = dir.join("catalog.toml");
    std::fs::write(
        &path,
        format!(
            "[[model]]\nid = \"{LORA}\"\nkind = \"adapter\"\nbase = \"{base}\"\n\
             description = \"a test adapter\"\n\
             source = {{ type = \"local\", path = \"{}\" }}\n",
            folder.display()
        ),
    )
    .unwrap();
    path
}

fn state_with(catalog: std::path::PathBuf) -> anyhow::Result<AppState> {
    let mut args = serve_args(vec![LORA.to_string()], 64, 8);
    args.store.catalog = Some(catalog);
    let (store, project) = new_store();
    build_state(&args, vec![KEY.to_string()], store, &project)
}

async fn chat(state: &AppState, model: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 16,
        "temperature": 0,
    });
    let reply = post(state, "/v1/chat/completions", &body.to_string()).await;
    (reply.status.as_u16(), reply.json())
}

#[tokio::test]
async fn a_catalogue_adapter_is_served_and_listed() {
    let dir = temp_dir();
    adapter(1, 192).save_dir(&dir.join("lora")).unwrap();
    adapter(2, 192).save_dir(&dir.join("ft")).unwrap();
    let catalog = catalogue(&dir, MODEL, &dir.join("lora"));
    let mut state = tokio::task::spawn_blocking(move || state_with(catalog))
        .await
        .unwrap()
        .expect("the adapter loads");
    state.adapter_source = Some(Arc::new(Jobs(dir.join("ft"))));

    let (status, base) = chat(&state, MODEL).await;
    assert_eq!(status, 200, "{base}");
    let (status, lora) = chat(&state, LORA).await;
    assert_eq!(status, 200, "{lora}");
    assert_eq!(lora["model"], LORA);
    let text = |v: &serde_json::Value| v["choices"][0]["message"]["content"].clone();
    assert_ne!(text(&base), text(&lora), "the adapter changed nothing");
    // Deterministic, and the same again once the adapter is cached.
    assert_eq!(text(&chat(&state, LORA).await.1), text(&lora));

    let (status, ft) = chat(&state, FT).await;
    assert_eq!(status, 200, "{ft}");
    assert_ne!(text(&ft), text(&lora));
    // The Responses API serves adapters the same way: the same text as chat.
    for (model, answer) in [(LORA, &lora), (FT, &ft)] {
        let body = serde_json::json!({"model": model, "input": "Name three colours.",
            "max_output_tokens": 16, "temperature": 0, "store": false});
        let reply = post(&state, "/v1/responses", &body.to_string()).await;
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text);
        let r = reply.json();
        assert_eq!(r["model"], model);
        assert_eq!(r["output"][0]["content"][0]["text"], text(answer), "{r}");
    }
    let (status, _) = chat(&state, "HuggingFaceTB/SmolLM2-135M-Instruct:x:ftjob-none").await;
    assert_eq!(status, 404);

    let list = send(&state, "GET", "/v1/models?verbose=true", Some(KEY), None)
        .await
        .json();
    let find = |id: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed: {list}"))
    };
    for id in [LORA, FT] {
        let m = find(id);
        assert_eq!(m["parent"], MODEL, "{m}");
        assert_eq!(m["root"], MODEL, "{m}");
        assert_eq!(m["kind"], "adapter", "{m}");
    }
    assert!(find(MODEL).get("parent").is_none());
    assert_eq!(state.chat[MODEL].engine.adapters().loaded().len(), 2);
}

#[test]
fn a_bad_adapter_or_base_fails_at_startup() {
    let dir = temp_dir();
    // v's B with 100 rows, the model's v projection has 192.
    adapter(1, 100).save_dir(&dir.join("bad")).unwrap();
    let err = state_with(catalogue(&dir, MODEL, &dir.join("bad")))
        .err()
        .expect("a wrong-shaped adapter is refused");
    let message = format!("{err:#}");
    assert!(
        message.contains(LORA) && message.contains("v_proj"),
        "{message}"
    );

    adapter(1, 192).save_dir(&dir.join("good")).unwrap();
    let err = state_with(catalogue(&dir, "nobody/unknown", &dir.join("good")))
        .err()
        .expect("an unknown base is refused");
    let message = format!("{err:#}");
    assert!(
        message.contains("nobody/unknown") && message.contains("not in the catalogue"),
        "{message}"
    );
}
