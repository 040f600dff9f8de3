//! The real `hearth` binary over TCP: a 50 MB file through upload, content
//! and a signed link (SHA-256 compared); the admin key printed once on the
//! first start; and a `kill -9` in the middle of an upload, after which the
//! restarted server has no row without a blob and no leftover parts.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::binary::Server;
use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";
const BOUNDARY: &str = "hearth-server-test-boundary";

/// Starts `hearth serve` with its store in `store_dir` (only the small
/// embedding model is loaded, to start fast).
fn start(store_dir: &Path) -> Server {
    start_with(store_dir, &[])
}

fn start_with(store_dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--models", EMBED];
    args.extend_from_slice(extra);
    common::binary::start(store_dir, &args)
}

/// Deterministic pseudo-random bytes (xorshift), fast to make.
fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn form_head(purpose: &str, filename: &str) -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes()
}

fn form_tail() -> Vec<u8> {
    format!("\r\n--{BOUNDARY}--\r\n").into_bytes()
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build()
}

fn sha256_of(reader: impl Read) -> (String, u64) {
    let mut reader = reader;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    (format!("{:x}", hasher.finalize()), total)
}

#[test]
fn a_50_mb_file_round_trips_through_upload_content_and_link() {
    let dir = temp_dir();
    let server = start(&dir);
    assert!(
        server.banner.iter().any(|l| l.contains("admin API key")),
        "the first start prints an admin key: {:?}",
        server.banner
    );
    let data = pseudo_random(50 * 1024 * 1024, 0x9E3779B97F4A7C15);
    let expected = format!("{:x}", Sha256::digest(&data));
    let body = form_head("user_data", "big.bin")
        .into_iter()
        .chain(data.iter().copied())
        .chain(form_tail())
        .collect::<Vec<u8>>();
    drop(data);
    let auth = format!("Bearer {KEY}");
    let file: Value = agent()
        .post(&format!("{}/v1/files", server.base))
        .set("Authorization", &auth)
        .set(
            "Content-Type",
            &format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .send_bytes(&body)
        .unwrap()
        .into_json()
        .unwrap();
    drop(body);
    assert_eq!(file["bytes"], 50 * 1024 * 1024, "{file}");
    let id = file["id"].as_str().unwrap();

    let response = agent()
        .get(&format!("{}/v1/files/{id}/content", server.base))
        .set("Authorization", &auth)
        .call()
        .unwrap();
    assert_eq!(
        sha256_of(response.into_reader()),
        (expected.clone(), 50 * 1024 * 1024)
    );

    let link: Value = agent()
        .get(&format!("{}/v1/files/{id}/link", server.base))
        .set("Authorization", &auth)
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let response = agent().get(link["url"].as_str().unwrap()).call().unwrap();
    assert_eq!(sha256_of(response.into_reader()).0, expected);
    drop(server);

    // A second start on the same store prints no key.
    let again = start(&dir);
    assert!(
        !again.banner.iter().any(|l| l.contains("hearth-")),
        "{:?}",
        again.banner
    );
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("blobs/files"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kill_9_mid_upload_leaves_no_row_without_a_blob() {
    let dir = temp_dir();
    let mut server = start(&dir);
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    // Announce 40 MB, send 20 (more than two parts), then kill the server.
    let head = form_head("fine-tune", "slow.jsonl");
    let total = head.len() + 40 * 1024 * 1024 + form_tail().len();
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /v1/files HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {total}\r\n\r\n"
    )
    .unwrap();
    stream.write_all(&head).unwrap();
    let line = b"{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}\n";
    let chunk: Vec<u8> = line.iter().copied().cycle().take(1024 * 1024).collect();
    for _ in 0..20 {
        stream.write_all(&chunk).unwrap();
    }
    stream.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(stream);
    assert!(
        leftovers(&dir).iter().any(|name| name.contains('#')),
        "the upload was under way: {:?}",
        leftovers(&dir)
    );

    // By default a young part stays (another node sharing the store may
    // still be writing it) ...
    drop(start(&dir));
    assert!(
        leftovers(&dir).iter().any(|name| name.contains('#')),
        "kept within the grace period: {:?}",
        leftovers(&dir)
    );
    // ... and on a single node nothing can be: swept at once.
    let server = start_with(&dir, &["--orphan-grace-secs", "0"]);
    assert!(
        leftovers(&dir).is_empty(),
        "swept on start: {:?}",
        leftovers(&dir)
    );
    let auth = format!("Bearer {KEY}");
    let list: Value = agent()
        .get(&format!("{}/v1/files", server.base))
        .set("Authorization", &auth)
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(
        list["data"],
        serde_json::json!([]),
        "no row for the killed upload"
    );

    // The restarted server stores and serves files; every row has its blob.
    let body: Vec<u8> = form_head("fine-tune", "ok.jsonl")
        .into_iter()
        .chain(line.iter().copied())
        .chain(form_tail())
        .collect();
    let file: Value = agent()
        .post(&format!("{}/v1/files", server.base))
        .set("Authorization", &auth)
        .set(
            "Content-Type",
            &format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .send_bytes(&body)
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(file["status"], "processed", "{file}");
    let store_dir = dir.clone();
    let (rows, blobs) = block_on(async move {
        let store = hearth_store::Store::open(&hearth_store::StoreConfig {
            data_dir: store_dir.clone(),
            database_url: Some(format!(
                "sqlite://{}?mode=rwc",
                store_dir.join("hearth.db").display()
            )),
            blob_url: Some(format!("file://{}", store_dir.join("blobs").display())),
        })
        .await
        .unwrap();
        let project = store.default_project().await.unwrap();
        let (rows, _) = store
            .list_files(&project.id, None, None, 100, hearth_store::ListOrder::Asc)
            .await
            .unwrap();
        let blobs = store.blobs().file_ids().await.unwrap();
        (rows.into_iter().map(|f| f.id).collect::<Vec<_>>(), blobs)
    });
    assert_eq!(rows, vec![file["id"].as_str().unwrap().to_string()]);
    assert_eq!(blobs, rows);
}
