//! The real `hearth` binary over TCP, for tests that restart or kill it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::{data_dir, store_flags, KEY};

/// A running `hearth serve`; killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// stdout lines before "listening".
    pub banner: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `hearth serve` on a free port with the test key, no user
/// catalogue, the shared data folder (models) and its store in `store_dir`,
/// plus `extra` arguments; returns once it listens.
pub fn start(store_dir: &Path, extra: &[&str]) -> Server {
    start_on(&store_flags(store_dir), extra, None)
}

/// [`start`] with the store named by `store` flags (`--database-url`,
/// `--blob-url`), its log (stderr) written to `log` when given.
pub fn start_on(store: &[String], extra: &[&str], log: Option<&Path>) -> Server {
    let stderr = match log {
        Some(path) => Stdio::from(std::fs::File::create(path).expect("the node's log file")),
        None => Stdio::null(),
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["serve", "--port", "0", "--api-key", KEY])
        .args(["--catalog", "/nonexistent/catalog.toml"])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir())
        .args(store)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starting hearth");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut banner = Vec::new();
    let base = loop {
        let line = lines
            .next()
            .expect("hearth exited before listening")
            .unwrap();
        if let Some(addr) = line.strip_prefix("Hearth is listening on ") {
            break addr.trim().to_string();
        }
        banner.push(line);
    };
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        base,
        banner,
    }
}

/// Uploads `content` as file `name` with `purpose` through the server's
/// `/v1/files` (multipart, the test key); the file's id.
pub fn upload(server: &Server, purpose: &str, name: &str, content: &str) -> String {
    const BOUNDARY: &str = "hearth-test-boundary";
    let body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{BOUNDARY}--\r\n"
    );
    let file: serde_json::Value = ureq::post(&format!("{}/v1/files", server.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .set(
            "Content-Type",
            &format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .send_bytes(body.as_bytes())
        .expect("upload")
        .into_json()
        .unwrap();
    assert_eq!(file["status"], "processed", "{file}");
    file["id"].as_str().unwrap().to_string()
}
