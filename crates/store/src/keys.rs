//! API keys. A key is `hearth-` and 32 random bytes in hex; only its SHA-256
//! is stored (a key of that entropy needs no slow hash), with a short prefix
//! to recognise it in lists. The key itself is shown once, at creation.
//! Every request looks its key up again, so a revoke takes effect at once.

use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

/// What every key starts with.
pub const KEY_PREFIX: &str = "hearth-";
/// Characters of a key kept to recognise it (`hearth-` and 8 more).
const SHOWN_CHARS: usize = KEY_PREFIX.len() + 8;

/// A fresh random key: `hearth-` and 32 random bytes in hex.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex::encode(bytes))
}

/// The stored form of a key.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A stored key, as lists show it (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub name: String,
    /// The key's first characters, e.g. `hearth-1a2b3c4d`.
    pub prefix: String,
    pub account_id: String,
    pub default_project_id: String,
    pub is_admin: bool,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// A key just made: its record and the key itself, to show once.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub info: KeyInfo,
    pub secret: String,
}

/// Who a request's key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The stored key (none for keys given on the command line).
    pub key_id: Option<String>,
    /// The key's account (none for keys given on the command line, which
    /// reach the default project only).
    pub account_id: Option<String>,
    pub is_admin: bool,
    pub default_project_id: String,
    pub last_used_at: Option<i64>,
    /// Set when the credential is a service account's access token.
    pub service_account_id: Option<String>,
    /// A service account whose strongest role is `viewer`: reads only.
    pub read_only: bool,
}

const SELECT_KEYS: &str = "SELECT k.id, k.name, k.prefix, k.account_id, k.created_at, \
     k.last_used_at, k.revoked_at, a.default_project_id, a.is_admin \
     FROM api_keys k JOIN accounts a ON a.id = k.account_id";

impl KeyInfo {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            prefix: row.try_get("prefix")?,
            account_id: row.try_get("account_id")?,
            default_project_id: row.try_get("default_project_id")?,
            is_admin: row.try_get::<i64, _>("is_admin")? != 0,
            created_at: row.try_get("created_at")?,
            last_used_at: row.try_get("last_used_at")?,
            revoked_at: row.try_get("revoked_at")?,
        })
    }
}

impl Store {
    /// Makes a key for a new account named `name` that reaches `project_id`
    /// (default: the default project). The returned secret is not stored.
    pub async fn create_key(
        &self,
        name: &str,
        project_id: Option<&str>,
        is_admin: bool,
    ) -> Result<NewKey> {
        ids::check_name("name", name).map_err(StoreError::Invalid)?;
        let project_id = match project_id {
            Some(id) => id.to_string(),
            None => self.default_project().await?.id,
        };
        let account = self.create_account(name, &project_id, is_admin).await?;
        self.add_key(&account.id, name).await
    }

    /// Makes another key for an existing account.
    pub async fn add_key(&self, account_id: &str, name: &str) -> Result<NewKey> {
        ids::check_name("name", name).map_err(StoreError::Invalid)?;
        let secret = generate_secret();
        let id = new_id(ids::KEY);
        sqlx::query(
            "INSERT INTO api_keys (id, account_id, name, prefix, hash, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(account_id)
        .bind(name)
        .bind(&secret[..SHOWN_CHARS])
        .bind(hash_secret(&secret))
        .bind(now())
        .execute(&self.pool)
        .await?;
        let info = self.key(&id).await?.ok_or(StoreError::NotFound("key"))?;
        Ok(NewKey { info, secret })
    }

    pub async fn key(&self, id: &str) -> Result<Option<KeyInfo>> {
        let row = sqlx::query(&format!("{SELECT_KEYS} WHERE k.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(KeyInfo::from_row).transpose()
    }

    /// Every key, revoked ones included, oldest first.
    pub async fn keys(&self) -> Result<Vec<KeyInfo>> {
        let rows = sqlx::query(&format!("{SELECT_KEYS} ORDER BY k.id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(KeyInfo::from_row).collect()
    }

    /// The keys of one account, revoked ones included, oldest first.
    pub async fn account_keys(&self, account_id: &str) -> Result<Vec<KeyInfo>> {
        let rows = sqlx::query(&format!(
            "{SELECT_KEYS} WHERE k.account_id = $1 ORDER BY k.id"
        ))
        .bind(account_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(KeyInfo::from_row).collect()
    }

    /// Revokes a key; later requests with it get 401. Revoking twice is fine.
    pub async fn revoke_key(&self, id: &str) -> Result<KeyInfo> {
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now())
            .bind(id)
            .execute(&self.pool)
            .await?;
        self.key(id).await?.ok_or(StoreError::NotFound("key"))
    }

    /// The caller a key belongs to, if it is a live stored key.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<Caller>> {
        if !secret.starts_with(KEY_PREFIX) {
            return Ok(None);
        }
        let row = sqlx::query(&format!(
            "{SELECT_KEYS} WHERE k.hash = $1 AND k.revoked_at IS NULL"
        ))
        .bind(hash_secret(secret))
        .fetch_optional(&self.pool)
        .await?;
        let Some(info) = row.as_ref().map(KeyInfo::from_row).transpose()? else {
            return Ok(None);
        };
        Ok(Some(Caller {
            key_id: Some(info.id),
            account_id: Some(info.account_id),
            is_admin: info.is_admin,
            default_project_id: info.default_project_id,
            last_used_at: info.last_used_at,
            service_account_id: None,
            read_only: false,
        }))
    }

    /// Records that a key was just used.
    pub async fn touch_key(&self, id: &str) -> Result<()> {
        sqlx::query("UPDATE api_keys SET last_used_at = $1 WHERE id = $2")
            .bind(now())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether `caller` may act in `project_id`.
    pub async fn caller_reaches(&self, caller: &Caller, project_id: &str) -> Result<bool> {
        match &caller.account_id {
            Some(account) => self.can_reach(account, project_id).await,
            None => Ok(project_id == caller.default_project_id),
        }
    }

    /// On a store without a live admin key: makes one (for a new admin
    /// account in the default project) and returns it, to be shown once.
    /// Nodes starting together on one store make one between them: a node
    /// first takes the setting `admin_bootstrap` (a token and the time),
    /// looks again for an admin key, makes the key and gives the setting
    /// back; a node that finds the setting taken makes none. A setting
    /// older than a minute (its node died in between) may be taken over.
    pub async fn bootstrap_admin(&self) -> Result<Option<NewKey>> {
        const SETTING: &str = "admin_bootstrap";
        let project = self.default_project().await?;
        if self.has_admin_key().await? {
            return Ok(None);
        }
        let now = crate::ids::now();
        let mine = format!("{}:{now}", crate::ids::random_hex());
        let held = self.setting_or_insert(SETTING, &mine).await?;
        if held != mine {
            let at: i64 = held
                .rsplit_once(':')
                .and_then(|(_, t)| t.parse().ok())
                .unwrap_or(0);
            let taken = now - at > 60
                && sqlx::query("UPDATE settings SET value = $1 WHERE name = $2 AND value = $3")
                    .bind(&mine)
                    .bind(SETTING)
                    .bind(&held)
                    .execute(&self.pool)
                    .await?
                    .rows_affected()
                    == 1;
            if !taken {
                return Ok(None);
            }
        }
        let made = if self.has_admin_key().await? {
            None
        } else {
            Some(self.create_key("admin", Some(&project.id), true).await?)
        };
        sqlx::query("DELETE FROM settings WHERE name = $1 AND value = $2")
            .bind(SETTING)
            .bind(&mine)
            .execute(&self.pool)
            .await?;
        Ok(made)
    }
}
