//! Verifying a token-exchange JWT: RS256 only, signed by an active
//! authorized key (`kid`) of the service account it names (`iss` = `sub`),
//! with an `exp` at most 5 minutes ahead, not expired, not before its
//! `nbf`, and its `jti` (when present) not exchanged before. Every refusal
//! is 401 code 16 with the reason; the signature is checked by
//! `jsonwebtoken` against the stored public key.

use base64::Engine;
use hearth_api::cloud::{CloudError, JWT_MAX_LIFETIME_SECS};
use hearth_store::iam::{AuthorizedKey, ServiceAccount};
use hearth_store::Store;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::CloudHttpError;

/// Clocks may differ by this much between the signer and the server.
pub const CLOCK_SKEW_SECS: i64 = 60;
/// Longest `jti` kept for replay checks.
const MAX_JTI_BYTES: usize = 256;

#[derive(Debug, Deserialize)]
struct Claims {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
    /// NumericDate: seconds, possibly with a fraction.
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    iat: Option<f64>,
    #[serde(default)]
    jti: Option<String>,
}

/// What a valid JWT proves.
#[derive(Debug)]
pub struct Verified {
    pub service_account: ServiceAccount,
    pub key: AuthorizedKey,
}

fn refused(reason: impl Into<String>) -> CloudHttpError {
    CloudHttpError(CloudError::unauthenticated(reason))
}

/// A JWT header's fields that matter here, as JSON values so that a wrong
/// type gets its own message. Deriving `Deserialize` refuses a field given
/// twice.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    alg: Option<serde_json::Value>,
    #[serde(default)]
    kid: Option<serde_json::Value>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// The header's `alg` and `kid`, read before anything is trusted.
fn header(jwt: &str) -> Result<(String, Option<String>), CloudHttpError> {
    let not_jwt =
        || refused("`subject_token` is not a JWT (three base64url parts, without padding).");
    let mut parts = jwt.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(not_jwt());
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| not_jwt())?;
    let header: Header = serde_json::from_slice(&bytes)
        .map_err(|e| refused(format!("The JWT header is not a valid JSON object: {e}.")))?;
    // RFC 7515 4.1.11: a `crit` extension the recipient does not
    // understand invalidates the JWT, and none is understood here.
    if header.crit.is_some() {
        return Err(refused(
            "The JWT header has `crit`: no critical extension is supported.",
        ));
    }
    let alg = match header.alg {
        Some(serde_json::Value::String(alg)) => alg,
        Some(_) => return Err(refused("The JWT header's `alg` must be a string.")),
        None => return Err(refused("The JWT header has no `alg`.")),
    };
    let kid = match header.kid {
        Some(serde_json::Value::String(kid)) => Some(kid),
        Some(_) => {
            return Err(refused(
                "The JWT header's `kid` must be a string: the authorized key's id.",
            ))
        }
        None => None,
    };
    Ok((alg, kid))
}

/// Checks `jwt` at time `now`; records its `jti` when it passes.
pub async fn verify_subject_jwt(
    store: &Store,
    jwt: &str,
    now: i64,
) -> Result<Verified, CloudHttpError> {
    let (alg, kid) = header(jwt)?;
    if alg != "RS256" {
        return Err(refused(format!(
            "The JWT is signed with `{alg}`: only RS256 is accepted."
        )));
    }
    let kid = kid.ok_or_else(|| {
        refused("The JWT header has no `kid`: set it to the authorized key's id.")
    })?;
    let key = store
        .authorized_key(&kid)
        .await?
        .ok_or_else(|| refused(format!("Unknown authorized key `{kid}`.")))?;
    let decoding = DecodingKey::from_rsa_pem(key.public_key.as_bytes())
        .map_err(|_| CloudHttpError(CloudError::internal()))?;
    let mut validation = Validation::new(Algorithm::RS256);
    validation.leeway = CLOCK_SKEW_SECS as u64;
    validation.validate_nbf = true;
    validation.validate_aud = false;
    validation.set_required_spec_claims(&["exp", "iss", "sub"]);
    let claims = jsonwebtoken::decode::<Claims>(jwt, &decoding, &validation)
        .map_err(|e| {
            refused(match e.kind() {
                ErrorKind::InvalidSignature => {
                    format!("The JWT's signature does not verify with the authorized key `{kid}`.")
                }
                ErrorKind::ExpiredSignature => "The JWT has expired.".to_string(),
                ErrorKind::ImmatureSignature => "The JWT is not valid yet (`nbf`).".to_string(),
                ErrorKind::MissingRequiredClaim(c) => format!(
                    "The JWT has no `{c}` claim, or not one of the right type{}.",
                    if c == "exp" {
                        " (a NumericDate: seconds since 1970, in range)"
                    } else {
                        ""
                    }
                ),
                ErrorKind::Base64(_) => {
                    "The JWT's parts must be base64url without padding.".to_string()
                }
                ErrorKind::Json(_) => {
                    "The JWT's claims are not valid JSON of the expected types.".to_string()
                }
                ErrorKind::InvalidAlgorithm => "Only RS256 is accepted.".to_string(),
                _ => format!("The JWT is not valid: {e}."),
            })
        })?
        .claims;
    // Only after the signature: who cannot sign with the key learns
    // nothing of its state.
    if key.revoked_at.is_some() {
        return Err(refused(format!("The authorized key `{kid}` is revoked.")));
    }
    if !key.is_active(now) {
        return Err(refused(format!("The authorized key `{kid}` has expired.")));
    }
    let numeric = |v: Option<f64>| {
        v.filter(|t| t.is_finite())
            .map(|t| t.floor().clamp(-1e15, 1e15) as i64)
    };
    let (exp, iat) = (numeric(claims.exp), numeric(claims.iat));
    let (Some(iss), Some(sub), Some(exp)) = (claims.iss, claims.sub, exp) else {
        return Err(refused(
            "The JWT must have `iss`, `sub` (the service account id) and `exp` claims.",
        ));
    };
    if sub != key.service_account_id {
        return Err(refused(format!(
            "The JWT's `sub` is not the service account of the authorized key `{kid}`."
        )));
    }
    if iss != sub {
        return Err(refused("The JWT's `iss` must equal its `sub`."));
    }
    let longest = JWT_MAX_LIFETIME_SECS + CLOCK_SKEW_SECS;
    if exp > now + longest {
        return Err(refused(
            "The JWT's `exp` is more than 5 minutes ahead: token-exchange JWTs live at most 5 minutes.",
        ));
    }
    if let Some(iat) = iat {
        if iat > now + CLOCK_SKEW_SECS {
            return Err(refused("The JWT's `iat` is in the future."));
        }
        if exp - iat > longest {
            return Err(refused(
                "The JWT's `exp` is more than 5 minutes after its `iat`: token-exchange JWTs live at most 5 minutes.",
            ));
        }
    }
    if let Some(jti) = &claims.jti {
        if jti.is_empty() || jti.len() > MAX_JTI_BYTES {
            return Err(refused(format!(
                "The JWT's `jti` must be 1 to {MAX_JTI_BYTES} bytes."
            )));
        }
        if !store.use_jwt_id(&sub, jti, exp).await? {
            return Err(refused(format!(
                "The JWT `{jti}` was already exchanged: sign a new one."
            )));
        }
    }
    let service_account = store
        .service_account(&sub)
        .await?
        .ok_or_else(|| refused("The JWT's service account no longer exists."))?;
    Ok(Verified {
        service_account,
        key,
    })
}
