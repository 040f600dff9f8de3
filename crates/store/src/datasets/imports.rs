//! Claims on imports from object storage: a `PENDING` upload with a
//! `source` is read by one node at a time, the way fine-tuning jobs and
//! batches are run. The node that holds it (`claimed_by`) renews a
//! heartbeat while it reads; an import whose heartbeat went stale (its node
//! died) is taken by another node and read again from the start. Each
//! claim counts an attempt, and the claim past the limit fails the upload,
//! so an object that kills its node every time is not retried forever.
//!
//! A node that lost its claim learns it from [`Store::renew_import`] and
//! stops without writing; [`Store::fail_import`] only applies while the
//! caller holds the claim, and completing is the upload's own conditional
//! step (`PENDING` only), so two readers never both end an upload.

use sqlx::Row;

use super::uploads::UPLOAD_COLUMNS;
use super::Upload;
use crate::error::Result;
use crate::ids::now;
use crate::Store;

/// The condition a claimable import meets (`$1` = stale-before time, `$2`
/// = the node).
const CLAIMABLE: &str = "(status = 'PENDING' AND source IS NOT NULL \
     AND (claimed_by IS NULL OR heartbeat_at IS NULL OR heartbeat_at < $1 OR claimed_by = $2))";

/// What a node may claim.
#[derive(Debug, Clone)]
pub struct ImportClaimRules<'a> {
    /// The node's id (`claimed_by`).
    pub node: &'a str,
    /// An import whose heartbeat is older than this many seconds is taken
    /// over.
    pub stale_after_secs: i64,
    /// Imports this node is reading now, or will not read (their URL is
    /// not under a prefix it may read): never claimed.
    pub skip: &'a [String],
    /// Claims an import may have; the one past it fails the upload.
    pub max_attempts: i64,
}

/// A claimed import: the upload and which attempt this is (1 = first).
#[derive(Debug, Clone)]
pub struct ImportClaim {
    pub upload: Upload,
    pub attempt: i64,
}

impl Store {
    /// Takes the oldest claimable import for `rules.node`: unclaimed, its
    /// node's heartbeat stale, or the node's own from before a restart.
    /// Atomic between nodes: each candidate is taken by a conditional
    /// `UPDATE` repeating the condition, and one another node took first
    /// is passed over. An import past `max_attempts` is failed (its parts'
    /// blob keys are in the second value, for the caller to delete) and
    /// the next one looked at. `None` when nothing is claimable.
    pub async fn claim_import(
        &self,
        rules: &ImportClaimRules<'_>,
    ) -> Result<(Option<ImportClaim>, Vec<String>)> {
        let mut passed: Vec<String> = Vec::new();
        let mut dropped_keys = Vec::new();
        loop {
            let stale_before = now() - rules.stale_after_secs;
            let rows = sqlx::query(&format!(
                "SELECT id FROM dataset_uploads WHERE {CLAIMABLE} \
                 ORDER BY created_at ASC, id ASC LIMIT 64"
            ))
            .bind(stale_before)
            .bind(rules.node)
            .fetch_all(&self.pool)
            .await?;
            let mut candidates = Vec::new();
            for row in &rows {
                let id: String = row.try_get("id")?;
                if !rules.skip.contains(&id) && !passed.contains(&id) {
                    candidates.push(id);
                }
            }
            if candidates.is_empty() {
                return Ok((None, dropped_keys));
            }
            for id in candidates {
                let done = sqlx::query(&format!(
                    "UPDATE dataset_uploads SET claimed_by = $2, heartbeat_at = $3, \
                     attempts = attempts + 1 WHERE id = $4 AND {CLAIMABLE}"
                ))
                .bind(stale_before)
                .bind(rules.node)
                .bind(now())
                .bind(&id)
                .execute(&self.pool)
                .await?;
                if done.rows_affected() != 1 {
                    continue; // another node was first
                }
                let row = sqlx::query(&format!(
                    "SELECT {UPLOAD_COLUMNS}, attempts FROM dataset_uploads WHERE id = $1"
                ))
                .bind(&id)
                .fetch_one(&self.pool)
                .await?;
                let attempt: i64 = row.try_get("attempts")?;
                let upload = Upload::from_row(&row)?;
                if attempt <= rules.max_attempts.max(1) {
                    return Ok((Some(ImportClaim { upload, attempt }), dropped_keys));
                }
                let tries = attempt - 1;
                let message = format!(
                    "the import stopped its node {tries} times without finishing (the process \
                     crashed or was killed); not trying again"
                );
                dropped_keys.extend(self.fail_import(&id, rules.node, &message).await?);
                passed.push(id);
            }
        }
    }

    /// Renews `node`'s claim on import `id`. False when it no longer holds
    /// it (taken over, ended or gone): the node must stop reading.
    pub async fn renew_import(&self, id: &str, node: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE dataset_uploads SET heartbeat_at = $1 \
             WHERE id = $2 AND claimed_by = $3 AND status = 'PENDING'",
        )
        .bind(now())
        .bind(id)
        .bind(node)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives import `id` back unread (the node shuts down in good order):
    /// the attempt does not count, and any node may claim it at once.
    pub async fn release_import(&self, id: &str, node: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE dataset_uploads SET claimed_by = NULL, heartbeat_at = NULL, \
             attempts = attempts - 1 WHERE id = $1 AND claimed_by = $2 AND status = 'PENDING'",
        )
        .bind(id)
        .bind(node)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Fails import `id` with `error` while `node` holds it; the blob keys
    /// of its parts, for the caller to delete (none when it did not apply).
    pub async fn fail_import(&self, id: &str, node: &str, error: &str) -> Result<Vec<String>> {
        let updated = sqlx::query(
            "UPDATE dataset_uploads SET status = 'FAILED', error = $1, completed_at = $2 \
             WHERE id = $3 AND status = 'PENDING' AND claimed_by = $4",
        )
        .bind(error)
        .bind(now())
        .bind(id)
        .bind(node)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() == 0 {
            return Ok(Vec::new());
        }
        self.drop_upload_parts(id).await
    }
}
