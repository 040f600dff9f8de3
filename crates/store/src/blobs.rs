//! Blob storage through `object_store`: a local folder by default, or any
//! S3-compatible store by URL. File contents live under `files/<file-id>`;
//! fine-tuning checkpoints under `fine_tuning/<job-id>/...` (written with
//! [`Blobs::put`], never touched by [`Blobs::sweep`], which only looks at
//! `files/`).
//!
//! Writes are atomic: an upload is a multipart upload that only appears under
//! its name when it completes (a local folder stages it as `<name>#<n>` and
//! renames it). The file's row is committed after that, and deleted before
//! the blob, so a row never points to a missing blob; what a crash can leave
//! is a blob without a row, or a staged part, which [`Blobs::sweep`] removes
//! on start once it is older than a grace period. In a local folder a blob
//! is flushed to disk (`fsync`, with its folder) before the write returns,
//! so the row committed after it survives a power loss only with its blob.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, WriteMultipart};

use crate::error::{Result, StoreError};

/// Part size of multipart uploads (S3 needs at least 5 MiB per part); also
/// the most an upload buffers in memory per part in flight.
const PART_BYTES: usize = 8 * 1024 * 1024;
/// Parts uploaded concurrently.
const PARTS_IN_FLIGHT: usize = 2;

#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    /// The folder, when blobs are local (to sweep staged parts).
    local_root: Option<PathBuf>,
    /// What the store is, for messages (no credentials).
    pub description: String,
}

impl std::fmt::Debug for Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

fn file_path(file_id: &str) -> ObjectPath {
    ObjectPath::from(format!("files/{file_id}"))
}

impl Blobs {
    /// A local folder (created if missing).
    pub fn local(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let root = root.canonicalize()?;
        Ok(Self {
            store: Arc::new(LocalFileSystem::new_with_prefix(&root)?),
            description: format!("folder {}", root.display()),
            local_root: Some(root),
        })
    }

    /// `file:///path` or `s3://bucket/prefix` (credentials, region and
    /// endpoint from the usual `AWS_*` environment variables).
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| StoreError::Invalid(format!("blob URL `{url}`: {e}")))?;
        match parsed.scheme() {
            "file" => {
                let path = parsed
                    .to_file_path()
                    .map_err(|_| StoreError::Invalid(format!("blob URL `{url}`: not a path")))?;
                Self::local(&path)
            }
            "s3" => {
                let bucket = parsed.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    return Err(StoreError::Invalid(format!("blob URL `{url}`: no bucket")));
                }
                let s3 = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()?;
                let prefix = parsed.path().trim_matches('/').to_string();
                let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(PrefixStore::new(s3, prefix.as_str()))
                };
                Ok(Self {
                    store,
                    local_root: None,
                    description: format!("s3://{bucket}/{prefix}"),
                })
            }
            other => Err(StoreError::Invalid(format!(
                "blob URL `{url}`: unsupported scheme `{other}` (use file:// or s3://)"
            ))),
        }
    }

    /// Starts writing the content of `file_id`.
    pub async fn writer(&self, file_id: &str) -> Result<BlobWriter> {
        let path = file_path(file_id);
        let upload = self.store.put_multipart(&path).await?;
        Ok(BlobWriter {
            inner: WriteMultipart::new_with_chunk_size(upload, PART_BYTES),
            bytes: 0,
            blobs: self.clone(),
            path,
        })
    }

    /// The content of `file_id`, as a stream of chunks.
    pub async fn read(
        &self,
        file_id: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, StoreError>>> {
        let result = self.store.get(&file_path(file_id)).await?;
        Ok(result.into_stream().map_err(StoreError::from).boxed())
    }

    /// Deletes the content of `file_id` (nothing if it is already gone).
    pub async fn delete(&self, file_id: &str) -> Result<()> {
        self.delete_key(file_path(file_id).as_ref()).await
    }

    /// Copies the object at `url` (`file:///path` or `s3://bucket/key`,
    /// credentials from the `AWS_*` environment) to the local file `path`,
    /// streamed; at most `limit` bytes ([`StoreError::TooLarge`] beyond).
    /// A missing object is [`StoreError::NotFound`].
    pub async fn download_url(url: &url::Url, path: &Path, limit: u64) -> Result<u64> {
        use tokio::io::AsyncWriteExt;
        let (store, location): (Arc<dyn ObjectStore>, ObjectPath) = match url.scheme() {
            "file" => {
                let file = url
                    .to_file_path()
                    .map_err(|_| StoreError::Invalid(format!("`{url}` is not a file path")))?;
                let location = ObjectPath::from_absolute_path(&file)
                    .map_err(|e| StoreError::Invalid(format!("`{url}`: {e}")))?;
                (Arc::new(LocalFileSystem::new()), location)
            }
            "s3" => {
                let bucket = url.host_str().unwrap_or_default();
                let s3 = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()?;
                (
                    Arc::new(s3),
                    ObjectPath::from(url.path().trim_start_matches('/')),
                )
            }
            other => {
                return Err(StoreError::Invalid(format!(
                    "`{url}`: unsupported scheme `{other}` (use file:// or s3://)"
                )))
            }
        };
        let result = match store.get(&location).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(StoreError::NotFound("object"))
            }
            Err(e) => return Err(e.into()),
        };
        if result.meta.size > limit {
            return Err(StoreError::TooLarge { limit });
        }
        let mut stream = result.into_stream();
        let mut file = tokio::fs::File::create(path).await?;
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            written += chunk.len() as u64;
            if written > limit {
                return Err(StoreError::TooLarge { limit });
            }
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        Ok(written)
    }

    /// Deletes the blob under `key` (nothing if it is already gone).
    pub async fn delete_key(&self, key: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the content of `file_id` exists.
    pub async fn exists(&self, file_id: &str) -> Result<bool> {
        match self.store.head(&file_path(file_id)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `bytes` under `key` (any path, e.g.
    /// `fine_tuning/<job-id>/step-10/adapter.safetensors`), replacing what
    /// was there; the blob appears whole.
    pub async fn put(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let path = ObjectPath::from(key);
        self.store
            .put(&path, object_store::PutPayload::from(bytes.to_vec()))
            .await?;
        self.sync(&path).await
    }

    /// The whole blob under `key`; [`StoreError::NotFound`] when missing.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        match self.store.get(&ObjectPath::from(key)).await {
            Ok(result) => Ok(result.bytes().await?.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::NotFound("blob")),
            Err(e) => Err(e.into()),
        }
    }

    /// The size in bytes of the blob under `key`; [`StoreError::NotFound`]
    /// when missing.
    pub async fn size(&self, key: &str) -> Result<u64> {
        match self.store.head(&ObjectPath::from(key)).await {
            Ok(meta) => Ok(meta.size),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::NotFound("blob")),
            Err(e) => Err(e.into()),
        }
    }

    /// The bytes `range` of the blob under `key`; [`StoreError::NotFound`]
    /// when missing.
    pub async fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        match self.store.get_range(&ObjectPath::from(key), range).await {
            Ok(bytes) => Ok(bytes),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::NotFound("blob")),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the local file at `path` under `key`, replacing what was
    /// there, streamed through a multipart upload (memory: the parts in
    /// flight, whatever the file's size); the blob appears whole, and in a
    /// local folder is on disk when this returns. Returns the bytes written.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<u64> {
        const READ_BYTES: usize = 1024 * 1024;
        let file = std::fs::File::open(path)?;
        let location = ObjectPath::from(key);
        let upload = self.store.put_multipart(&location).await?;
        let mut writer = BlobWriter {
            inner: WriteMultipart::new_with_chunk_size(upload, PART_BYTES),
            bytes: 0,
            blobs: self.clone(),
            path: location,
        };
        // Blocking reads on the blocking pool, one buffer going back and forth.
        let mut state = (file, vec![0u8; READ_BYTES]);
        loop {
            let read = tokio::task::spawn_blocking(move || {
                let (mut file, mut buf) = state;
                let n = loop {
                    match std::io::Read::read(&mut file, &mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        n => break n,
                    }
                };
                (n, (file, buf))
            })
            .await
            .map_err(|e| StoreError::Io(std::io::Error::other(e)));
            let (n, back) = match read {
                Ok((Ok(n), back)) => (n, back),
                Ok((Err(e), _)) => {
                    writer.abort().await;
                    return Err(e.into());
                }
                Err(e) => {
                    writer.abort().await;
                    return Err(e);
                }
            };
            state = back;
            if n == 0 {
                break;
            }
            if let Err(e) = writer.write(&state.1[..n]).await {
                writer.abort().await;
                return Err(e);
            }
        }
        writer.finish().await
    }

    /// Deletes every blob whose key starts with the path `prefix` (whole
    /// segments: `fine_tuning/ftjob-1` does not match `fine_tuning/ftjob-10`).
    pub async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        let prefix = ObjectPath::from(prefix);
        let keys: Vec<ObjectPath> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await?;
        for key in keys {
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Every key under the path `prefix`.
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        let prefix = ObjectPath::from(prefix);
        let keys: Vec<String> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await?;
        Ok(keys)
    }

    /// Ids of every stored file content.
    pub async fn file_ids(&self) -> Result<Vec<String>> {
        let prefix = ObjectPath::from("files");
        let mut ids = Vec::new();
        let mut list = self.store.list(Some(&prefix));
        while let Some(meta) = list.next().await {
            if let Some(name) = meta?.location.filename() {
                ids.push(name.to_string());
            }
        }
        Ok(ids)
    }

    /// Removes the file blobs (`files/<id>`) not in `keep`, and staged parts
    /// of uploads that never finished (a local folder's `files/<name>#<n>`
    /// files), when they are at least `grace` old: a younger one may be an
    /// upload in progress on another node sharing the store, whose row is
    /// about to commit. Returns how many blobs were removed. Blobs outside
    /// `files/` (fine-tuning checkpoints under `fine_tuning/`) are never
    /// touched.
    pub async fn sweep(&self, keep: &HashSet<String>, grace: Duration) -> Result<usize> {
        let now = SystemTime::now();
        let old_enough =
            |modified: SystemTime| now.duration_since(modified).unwrap_or(Duration::ZERO) >= grace;
        let mut removed = 0;
        let metas: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&ObjectPath::from("files")))
            .try_collect()
            .await?;
        for meta in metas {
            let Some(id) = meta.location.filename() else {
                continue;
            };
            if keep.contains(id) || !old_enough(SystemTime::from(meta.last_modified)) {
                continue;
            }
            self.delete(id).await?;
            removed += 1;
        }
        if let Some(root) = &self.local_root {
            let dir = root.join("files");
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let staged =
                        name.to_str()
                            .and_then(|n| n.rsplit_once('#'))
                            .is_some_and(|(_, n)| {
                                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                            });
                    let modified = entry.metadata().and_then(|m| m.modified());
                    if staged && modified.is_ok_and(old_enough) {
                        std::fs::remove_file(entry.path())?;
                        removed += 1;
                    }
                }
            }
        }
        Ok(removed)
    }

    /// On a local folder, flushes the blob under `key` and its folder to
    /// disk, so that a row committed next never points at a blob a power
    /// loss could take back. Object stores are durable once a write returns.
    async fn sync(&self, key: &ObjectPath) -> Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        let path = key
            .parts()
            .fold(root.clone(), |p, part| p.join(part.as_ref()));
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&path)?.sync_all()?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| StoreError::Io(std::io::Error::other(e)))??;
        Ok(())
    }
}

/// An upload in progress: chunks go out in parts as they come; the blob
/// appears only on [`BlobWriter::finish`].
pub struct BlobWriter {
    inner: WriteMultipart,
    bytes: u64,
    blobs: Blobs,
    path: ObjectPath,
}

impl BlobWriter {
    pub async fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.inner.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        self.inner.write(chunk);
        self.bytes += chunk.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Completes the upload; the blob appears at once, whole (and, in a
    /// local folder, is on disk when this returns).
    pub async fn finish(self) -> Result<u64> {
        self.inner.finish().await?;
        self.blobs.sync(&self.path).await?;
        Ok(self.bytes)
    }

    /// Gives the upload up; nothing stays behind.
    pub async fn abort(self) {
        if let Err(e) = self.inner.abort().await {
            tracing::warn!("aborting an upload: {e}");
        }
    }
}
