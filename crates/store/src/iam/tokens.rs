//! Access tokens of the cloud platform API: opaque random strings given
//! out by the token exchange, valid 12 hours, kept only as SHA-256. A
//! token stops working when it expires, when the authorized key whose JWT
//! it was exchanged for is revoked or expires, or when its service account
//! is deleted. The JWT ids already exchanged are kept until the JWTs
//! expire, so a JWT cannot be exchanged twice.

use rand::RngCore;
use sqlx::Row;

use crate::error::Result;
use crate::ids::now;
use crate::keys::hash_secret;
use crate::Store;

/// What every access token starts with (never an API key's `hearth-`).
pub const ACCESS_TOKEN_PREFIX: &str = "hearthtok_";

/// A token just issued: shown once.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: String,
    pub expires_at: i64,
}

/// Whom a live access token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    pub service_account_id: String,
    pub account_id: String,
    pub default_project_id: String,
    pub expires_at: i64,
}

impl Store {
    /// A new token for `service_account_id`, exchanged for a JWT signed by
    /// `authorized_key_id`, valid `lifetime_secs`. Drops expired tokens.
    pub async fn issue_access_token(
        &self,
        service_account_id: &str,
        authorized_key_id: &str,
        lifetime_secs: i64,
    ) -> Result<IssuedToken> {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let token = format!("{ACCESS_TOKEN_PREFIX}{}", hex::encode(bytes));
        let created_at = now();
        let expires_at = created_at + lifetime_secs;
        sqlx::query("DELETE FROM access_tokens WHERE expires_at <= $1")
            .bind(created_at)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO access_tokens (hash, service_account_id, authorized_key_id, \
             created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(hash_secret(&token))
        .bind(service_account_id)
        .bind(authorized_key_id)
        .bind(created_at)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(IssuedToken { token, expires_at })
    }

    /// The holder of a live token (none for unknown, expired or revoked ones).
    pub async fn token_holder(&self, token: &str) -> Result<Option<TokenHolder>> {
        if !token.starts_with(ACCESS_TOKEN_PREFIX) {
            return Ok(None);
        }
        let now = now();
        let row = sqlx::query(
            "SELECT t.service_account_id, t.expires_at, s.account_id, a.default_project_id \
             FROM access_tokens t \
             JOIN authorized_keys k ON k.id = t.authorized_key_id \
             JOIN service_accounts s ON s.id = t.service_account_id \
             JOIN accounts a ON a.id = s.account_id \
             WHERE t.hash = $1 AND t.expires_at > $2 AND k.revoked_at IS NULL \
             AND (k.expires_at IS NULL OR k.expires_at > $2)",
        )
        .bind(hash_secret(token))
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(TokenHolder {
                service_account_id: r.try_get("service_account_id")?,
                account_id: r.try_get("account_id")?,
                default_project_id: r.try_get("default_project_id")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    /// Records that the JWT `jti` of `service_account_id` (valid until
    /// `expires_at`) was exchanged; false when it already was.
    pub async fn use_jwt_id(
        &self,
        service_account_id: &str,
        jti: &str,
        expires_at: i64,
    ) -> Result<bool> {
        sqlx::query("DELETE FROM used_jwt_ids WHERE expires_at < $1")
            .bind(now() - 3600)
            .execute(&self.pool)
            .await?;
        let done = sqlx::query(
            "INSERT INTO used_jwt_ids (service_account_id, jti, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (service_account_id, jti) DO NOTHING",
        )
        .bind(service_account_id)
        .bind(jti)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
