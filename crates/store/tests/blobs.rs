//! The blob store against a local folder and, when `HEARTH_TEST_S3_URL`
//! names one (`s3://bucket/prefix`, with `AWS_ENDPOINT`, credentials and
//! `AWS_ALLOW_HTTP` in the environment, as `scripts/test` sets them for the
//! S3-compatible server it starts), a live S3-compatible server: multipart
//! uploads of several parts, ranged reads, listing, deletes, the orphan
//! sweep, and aborted uploads that leave nothing behind.
//!
//! Without `HEARTH_TEST_S3_URL` the S3 half says it is skipped.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::TryStreamExt;
use hearth_store::blobs::Blobs;

/// Bigger than two of the store's 8 MiB parts, and not a multiple of one.
const BIG: usize = 20 * 1024 * 1024 + 12345;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Each backend to test: (name, store, the S3 server's data folder when
/// known).
fn backends(tag: &str) -> Vec<(String, Blobs, Option<PathBuf>)> {
    let local = tempfile::tempdir().unwrap().keep();
    let mut out = vec![(
        "local folder".to_string(),
        Blobs::local(&local).unwrap(),
        None,
    )];
    match std::env::var("HEARTH_TEST_S3_URL") {
        Ok(url) => {
            // A prefix per test and run, so tests do not see each other.
            let url = format!(
                "{}/{tag}-{}-{}",
                url.trim_end_matches('/'),
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            );
            let blobs = Blobs::from_url(&url).expect("the S3 store");
            let dir = std::env::var_os("HEARTH_TEST_S3_DIR").map(PathBuf::from);
            out.push((url, blobs, dir));
        }
        Err(_) => eprintln!("HEARTH_TEST_S3_URL is not set: the S3 half is skipped"),
    }
    out
}

/// The tests one at a time: the abort test compares the S3 server's folder
/// before and after, which another test's upload in flight would disturb.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn read_all(blobs: &Blobs, id: &str) -> Vec<u8> {
    let chunks: Vec<bytes::Bytes> = blobs.read(id).await.unwrap().try_collect().await.unwrap();
    chunks.concat()
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_uploads_read_back_whole_and_by_range() {
    let _serial = SERIAL.lock().await;
    for (name, blobs, _) in backends("multipart") {
        let data = pattern(BIG, 7);
        let mut w = blobs.writer("file-big").await.unwrap();
        // Uneven chunks, as an HTTP upload delivers them.
        for chunk in data.chunks(3 * 1024 * 1024 + 17) {
            w.write(chunk).await.unwrap();
        }
        assert_eq!(w.finish().await.unwrap(), BIG as u64, "{name}");
        assert!(blobs.exists("file-big").await.unwrap(), "{name}");
        assert_eq!(
            blobs.size("files/file-big").await.unwrap(),
            BIG as u64,
            "{name}"
        );
        assert!(
            read_all(&blobs, "file-big").await == data,
            "{name}: content differs"
        );
        // Ranges inside one part, across a part boundary, and the tail.
        let part = 8 * 1024 * 1024;
        for range in [5..1000, part - 10..part + 10, BIG - 100..BIG] {
            let got = blobs
                .get_range("files/file-big", range.start as u64..range.end as u64)
                .await
                .unwrap();
            assert_eq!(&got[..], &data[range.clone()], "{name}: range {range:?}");
        }
        // Small objects too.
        blobs
            .put("fine_tuning/job-1/step-1/adapter.bin", b"abc")
            .await
            .unwrap();
        assert_eq!(
            blobs
                .get("fine_tuning/job-1/step-1/adapter.bin")
                .await
                .unwrap(),
            b"abc",
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_deletes_and_the_sweep() {
    let _serial = SERIAL.lock().await;
    for (name, blobs, _) in backends("listing") {
        for id in ["file-a", "file-b", "file-c"] {
            let mut w = blobs.writer(id).await.unwrap();
            w.write(id.as_bytes()).await.unwrap();
            w.finish().await.unwrap();
        }
        blobs.put("fine_tuning/job-9/x", b"1").await.unwrap();
        blobs.put("fine_tuning/job-9/y", b"2").await.unwrap();
        let mut ids = blobs.file_ids().await.unwrap();
        ids.sort();
        assert_eq!(ids, ["file-a", "file-b", "file-c"], "{name}");
        let mut keys = blobs.keys("fine_tuning/job-9").await.unwrap();
        keys.sort();
        assert_eq!(keys.len(), 2, "{name}: {keys:?}");
        assert!(keys[0].ends_with("fine_tuning/job-9/x"), "{name}: {keys:?}");

        blobs.delete("file-b").await.unwrap();
        assert!(!blobs.exists("file-b").await.unwrap(), "{name}");
        // Deleting what is gone is not an error.
        blobs.delete("file-b").await.unwrap();
        blobs.delete_prefix("fine_tuning/job-9").await.unwrap();
        assert!(
            blobs.keys("fine_tuning/job-9").await.unwrap().is_empty(),
            "{name}"
        );

        // The sweep keeps what has a row and what is younger than the grace.
        let keep: HashSet<String> = ["file-a".to_string()].into();
        assert_eq!(
            blobs.sweep(&keep, Duration::from_secs(3600)).await.unwrap(),
            0
        );
        assert_eq!(
            blobs.sweep(&keep, Duration::ZERO).await.unwrap(),
            1,
            "{name}"
        );
        assert_eq!(blobs.file_ids().await.unwrap(), ["file-a"], "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aborted_upload_leaves_nothing_behind() {
    let _serial = SERIAL.lock().await;
    for (name, blobs, server_dir) in backends("abort") {
        let files_before = server_dir.as_deref().map(files_under);
        let mut w = blobs.writer("file-gone").await.unwrap();
        // Enough for parts to have gone out before the abort.
        for chunk in pattern(BIG, 3).chunks(1 << 20) {
            w.write(chunk).await.unwrap();
        }
        w.abort().await;
        assert!(!blobs.exists("file-gone").await.unwrap(), "{name}");
        assert!(blobs.file_ids().await.unwrap().is_empty(), "{name}");
        // On the server's disk: no state of the upload left. (s3s-fs keeps
        // an upload's parts and record in `.upload…` files in its root
        // until the upload completes or is aborted.)
        if let (Some(dir), Some(before)) = (server_dir, files_before) {
            let after = files_under(&dir);
            let new: Vec<_> = after.difference(&before).collect();
            assert!(
                new.iter().all(|p| !p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(".upload"))),
                "{name}: left behind on the server: {new:?}"
            );
        }
    }
}

/// Every file below `dir`.
fn files_under(dir: &std::path::Path) -> HashSet<PathBuf> {
    let mut out = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p);
            }
        }
    }
    out
}
