//! Sessions of the web console. Signing in with a stored API key makes a
//! session: a random token for the browser's cookie (only its SHA-256 is
//! kept), a random form token against cross-site requests, the project the
//! console shows, and an expiry. Every lookup joins the key, so a revoked
//! key's sessions stop working at once; signing out deletes the row.

use rand::RngCore;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::now;
use crate::keys::{hash_secret, Caller};
use crate::Store;

/// A live session: who it is, where it is, and its form token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// The signed-in key's caller (as the API sees the same key).
    pub caller: Caller,
    /// The key's name (shown in the console's header).
    pub key_name: String,
    /// The project the console shows.
    pub project_id: String,
    /// The token every form of this session must carry.
    pub csrf_token: String,
    pub expires_at: i64,
}

/// 32 random bytes in hex.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

impl Store {
    /// Starts a session for the live stored key `key_id`, in its default
    /// project, valid for `ttl_secs`; returns the token for the cookie (not
    /// stored). Expired sessions are deleted on the way.
    pub async fn create_console_session(&self, key_id: &str, ttl_secs: i64) -> Result<String> {
        let key = self
            .key(key_id)
            .await?
            .filter(|k| k.revoked_at.is_none())
            .ok_or(StoreError::NotFound("key"))?;
        let now = now();
        sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        let token = random_token();
        sqlx::query(
            "INSERT INTO console_sessions \
             (token_hash, key_id, project_id, csrf_token, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(hash_secret(&token))
        .bind(&key.id)
        .bind(&key.default_project_id)
        .bind(random_token())
        .bind(now)
        .bind(now + ttl_secs)
        .execute(&self.pool)
        .await?;
        Ok(token)
    }

    /// The session of a cookie's token, if it is unexpired and its key is
    /// not revoked.
    pub async fn console_session(&self, token: &str) -> Result<Option<ConsoleSession>> {
        let row = sqlx::query(
            "SELECT s.project_id, s.csrf_token, s.expires_at, k.id AS key_id, k.name, \
             k.account_id, k.last_used_at, a.is_admin, a.default_project_id \
             FROM console_sessions s JOIN api_keys k ON k.id = s.key_id \
             JOIN accounts a ON a.id = k.account_id \
             WHERE s.token_hash = $1 AND s.expires_at > $2 AND k.revoked_at IS NULL",
        )
        .bind(hash_secret(token))
        .bind(now())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(ConsoleSession {
            caller: Caller {
                key_id: Some(row.try_get("key_id")?),
                account_id: Some(row.try_get("account_id")?),
                is_admin: row.try_get::<i64, _>("is_admin")? != 0,
                default_project_id: row.try_get("default_project_id")?,
                last_used_at: row.try_get("last_used_at")?,
                service_account_id: None,
                read_only: false,
            },
            key_name: row.try_get("name")?,
            project_id: row.try_get("project_id")?,
            csrf_token: row.try_get("csrf_token")?,
            expires_at: row.try_get("expires_at")?,
        }))
    }

    /// Points a session at another project (the caller checks access).
    pub async fn set_console_project(&self, token: &str, project_id: &str) -> Result<()> {
        let done = sqlx::query("UPDATE console_sessions SET project_id = $1 WHERE token_hash = $2")
            .bind(project_id)
            .bind(hash_secret(token))
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound("console session"));
        }
        Ok(())
    }

    /// Ends a session (signing out); ending one that is gone is fine.
    pub async fn delete_console_session(&self, token: &str) -> Result<()> {
        sqlx::query("DELETE FROM console_sessions WHERE token_hash = $1")
            .bind(hash_secret(token))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
