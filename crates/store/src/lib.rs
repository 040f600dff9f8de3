//! hearth-store: Hearth's metadata and blobs.
//!
//! Metadata (projects, accounts, API keys, files, settings) lives in SQL
//! through sqlx's `Any` driver: SQLite by default (`<data-dir>/hearth.db`,
//! WAL, foreign keys on) or PostgreSQL by URL. Every query is written once,
//! portable between the two (`$1` placeholders, `TEXT` and `BIGINT` columns).
//! Blobs (file contents) live in an `object_store`: a local folder by default
//! (`<data-dir>/blobs`) or an S3-compatible bucket.
//!
//! One module per repository: [`projects`], [`accounts`], [`keys`],
//! [`files`], [`fine_tuning`] (jobs, events, checkpoints), [`batches`]
//! (batches and their requests' results), [`responses`], [`endpoints`]
//! (dedicated endpoints' desired state), [`iam`] (service accounts, their
//! groups, authorized keys and access tokens), [`adapters`] (LoRA adapters
//! imported per project), [`console_sessions`] (the web console's sign-ins);
//! [`links`] signs download links;
//! [`jsonl`] checks uploads; [`usage`] keeps usage sums, quotas and budgets.

pub mod accounts;
pub mod adapters;
pub mod batches;
pub mod blobs;
pub mod console_sessions;
pub mod datasets;
pub mod db;
pub mod endpoint_claims;
pub mod endpoints;
pub mod error;
pub mod files;
pub mod fine_tuning;
pub mod iam;
pub mod ids;
pub mod jsonl;
pub mod keys;
pub mod links;
pub mod nodes;
pub mod projects;
pub mod responses;
pub mod usage;

use std::collections::HashSet;
use std::path::PathBuf;

use rand::RngCore;
use sqlx::{AnyPool, Row};

pub use adapters::{ImportedAdapter, NewAdapter};
pub use batches::{Batch, BatchClaimRules, BatchResult, BatchStatus, NewBatch};
pub use blobs::{BlobWriter, Blobs};
pub use db::Backend;
pub use endpoint_claims::EndpointHost;
pub use endpoints::{DedicatedEndpoint, EndpointPatch, NewEndpoint};
pub use error::{Result, StoreError};
pub use files::{FileRecord, FileStatus, ListOrder};
pub use fine_tuning::{
    ft_blob_prefix, ClaimRules, FtCheckpoint, FtEvent, FtJob, FtStatus, NewCheckpoint, NewFtJob,
    ResultFile,
};
pub use keys::{Caller, KeyInfo, NewKey};
pub use projects::Project;
pub use responses::StoredResponse;

/// How old a blob without a row must be before the start-up sweep removes
/// it (uploads in progress on other nodes sharing the store are younger).
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Where the store lives.
#[derive(Debug, Clone, Default)]
pub struct StoreConfig {
    /// Holds `hearth.db` and `blobs/` unless the URLs below say otherwise.
    pub data_dir: PathBuf,
    /// `sqlite://PATH` or `postgres://...` (default: `<data-dir>/hearth.db`).
    pub database_url: Option<String>,
    /// `file:///PATH` or `s3://bucket/prefix` (default: `<data-dir>/blobs`).
    pub blob_url: Option<String>,
}

/// A handle on the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(crate) pool: AnyPool,
    pub(crate) blobs: Blobs,
    backend: Backend,
    link_secret: std::sync::Arc<Vec<u8>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("blobs", &self.blobs)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the database and the blob store, and runs
    /// the migrations.
    pub async fn open(config: &StoreConfig) -> Result<Self> {
        let url = match &config.database_url {
            Some(url) => url.clone(),
            None => {
                std::fs::create_dir_all(&config.data_dir)?;
                db::sqlite_url(&config.data_dir.join("hearth.db"))
            }
        };
        let blobs = match &config.blob_url {
            Some(url) => Blobs::from_url(url)?,
            None => Blobs::local(&config.data_dir.join("blobs"))?,
        };
        let (pool, backend) = db::open(&url).await?;
        let mut store = Self {
            pool,
            blobs,
            backend,
            link_secret: Default::default(),
        };
        store.link_secret = std::sync::Arc::new(store.secret("link_secret").await?);
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    pub(crate) fn link_secret(&self) -> &[u8] {
        &self.link_secret
    }

    /// A setting's value, if set.
    pub async fn setting(&self, name: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<String, _>("value")).transpose()?)
    }

    /// Sets a setting unless it is already set; returns the value kept.
    pub async fn setting_or_insert(&self, name: &str, value: &str) -> Result<String> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        Ok(self
            .setting(name)
            .await?
            .unwrap_or_else(|| value.to_string()))
    }

    /// A random 32-byte server secret kept in the settings (made once).
    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let value = self.setting_or_insert(name, &hex::encode(bytes)).await?;
        hex::decode(value).map_err(|_| StoreError::Invalid(format!("setting `{name}` is not hex")))
    }

    /// Removes file blobs (`files/<id>`) that no file row points to, and
    /// staged parts of uploads that never finished (left by a crash), once
    /// they are `grace` old ([`ORPHAN_GRACE`] on start): an upload in
    /// progress, here or on another node sharing the store, looks the same
    /// until its row commits. Other blobs (fine-tuning checkpoints under
    /// `fine_tuning/`, imported adapters under `adapters/`) are kept.
    pub async fn sweep_orphan_blobs(&self, grace: std::time::Duration) -> Result<usize> {
        // Blobs listed after the rows: a blob whose row commits in between
        // is younger than any sensible grace.
        let keep: HashSet<String> = self.all_file_ids().await?.into_iter().collect();
        self.blobs.sweep(&keep, grace).await
    }
}
