//! Authorized keys: the public halves of the RSA key pairs that sign a
//! service account's token-exchange JWTs. The server checks the PEM (RSA,
//! 4096 bits) before it stores one; the store keeps it as given, with its
//! fingerprint, an optional expiry and a revocation time.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthorizedKey {
    pub id: String,
    pub service_account_id: String,
    /// The PEM, as uploaded.
    pub public_key: String,
    /// E.g. `RSA_4096`.
    pub algorithm: String,
    /// SHA-256 of the key's DER encoding, in hex.
    pub fingerprint: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl AuthorizedKey {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            service_account_id: row.try_get("service_account_id")?,
            public_key: row.try_get("public_key")?,
            algorithm: row.try_get("algorithm")?,
            fingerprint: row.try_get("fingerprint")?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            revoked_at: row.try_get("revoked_at")?,
        })
    }

    /// Neither revoked nor past its expiry at `now`.
    pub fn is_active(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|t| t > now)
    }
}

/// A checked public key to store.
#[derive(Debug, Clone)]
pub struct NewAuthorizedKey {
    pub service_account_id: String,
    pub public_key: String,
    pub algorithm: String,
    pub fingerprint: String,
    pub expires_at: Option<i64>,
}

const SELECT_KEYS: &str = "SELECT id, service_account_id, public_key, algorithm, fingerprint, \
     created_at, expires_at, revoked_at FROM authorized_keys";

impl Store {
    pub async fn add_authorized_key(&self, new: NewAuthorizedKey) -> Result<AuthorizedKey> {
        if self
            .service_account(&new.service_account_id)
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound("service account"));
        }
        if new.expires_at.is_some_and(|t| t <= now()) {
            return Err(StoreError::Invalid(
                "the key's expiry is in the past".to_string(),
            ));
        }
        let same = self
            .authorized_keys(Some(&new.service_account_id), None)
            .await?
            .into_iter()
            .find(|k| k.fingerprint == new.fingerprint && k.revoked_at.is_none());
        if let Some(same) = same {
            return Err(StoreError::InUse(format!(
                "this public key is already authorized as `{}`",
                same.id
            )));
        }
        let id = new_id(ids::AUTHORIZED_KEY);
        sqlx::query(
            "INSERT INTO authorized_keys (id, service_account_id, public_key, algorithm, \
             fingerprint, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(&new.service_account_id)
        .bind(&new.public_key)
        .bind(&new.algorithm)
        .bind(&new.fingerprint)
        .bind(now())
        .bind(new.expires_at)
        .execute(&self.pool)
        .await?;
        self.authorized_key(&id)
            .await?
            .ok_or(StoreError::NotFound("authorized key"))
    }

    pub async fn authorized_key(&self, id: &str) -> Result<Option<AuthorizedKey>> {
        let row = sqlx::query(&format!("{SELECT_KEYS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(AuthorizedKey::from_row).transpose()
    }

    /// The keys of one service account, or of all the service accounts of
    /// `account_id`, or every key; revoked ones included, oldest first.
    pub async fn authorized_keys(
        &self,
        service_account_id: Option<&str>,
        account_id: Option<&str>,
    ) -> Result<Vec<AuthorizedKey>> {
        let rows = match (service_account_id, account_id) {
            (Some(sa), _) => {
                sqlx::query(&format!(
                    "{SELECT_KEYS} WHERE service_account_id = $1 ORDER BY id"
                ))
                .bind(sa)
                .fetch_all(&self.pool)
                .await?
            }
            (None, Some(account)) => {
                sqlx::query(&format!(
                    "{SELECT_KEYS} WHERE service_account_id IN \
                     (SELECT id FROM service_accounts WHERE account_id = $1) ORDER BY id"
                ))
                .bind(account)
                .fetch_all(&self.pool)
                .await?
            }
            (None, None) => {
                sqlx::query(&format!("{SELECT_KEYS} ORDER BY id"))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(AuthorizedKey::from_row).collect()
    }

    /// Revokes a key: JWTs it signs and the access tokens already issued
    /// for them are refused from now on. Revoking twice is fine.
    pub async fn revoke_authorized_key(&self, id: &str) -> Result<AuthorizedKey> {
        sqlx::query(
            "UPDATE authorized_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
        )
        .bind(now())
        .bind(id)
        .execute(&self.pool)
        .await?;
        self.authorized_key(id)
            .await?
            .ok_or(StoreError::NotFound("authorized key"))
    }
}
