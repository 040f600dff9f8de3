//! The cloud platform API's wire types: its error model (`{code, message}`
//! with the code deciding the HTTP status), the token exchange's form and
//! answer, the profile, and the objects of service accounts, authorized
//! keys and groups.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The canonical codes the cloud API answers with (2, 12 and 15 never are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudCode {
    Cancelled = 1,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl CloudCode {
    /// The HTTP status the spec's table gives the code.
    pub fn status(self) -> u16 {
        match self {
            CloudCode::Cancelled => 499,
            CloudCode::InvalidArgument | CloudCode::FailedPrecondition | CloudCode::OutOfRange => {
                400
            }
            CloudCode::DeadlineExceeded => 504,
            CloudCode::NotFound => 404,
            CloudCode::AlreadyExists | CloudCode::Aborted => 409,
            CloudCode::PermissionDenied => 403,
            CloudCode::ResourceExhausted => 429,
            CloudCode::Internal => 500,
            CloudCode::Unavailable => 503,
            CloudCode::Unauthenticated => 401,
        }
    }
}

/// A cloud API error: the body is `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudError {
    pub code: CloudCode,
    pub message: String,
}

/// The cloud API's error body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CloudErrorBody {
    /// The canonical status code (16 UNAUTHENTICATED, 3 INVALID_ARGUMENT, ...).
    pub code: u8,
    pub message: String,
}

impl CloudError {
    pub fn new(code: CloudCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(CloudCode::InvalidArgument, message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(CloudCode::Unauthenticated, message)
    }

    pub fn denied(message: impl Into<String>) -> Self {
        Self::new(CloudCode::PermissionDenied, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(CloudCode::NotFound, message)
    }

    pub fn internal() -> Self {
        Self::new(
            CloudCode::Internal,
            "Internal error, please try again later.",
        )
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    pub fn body(&self) -> CloudErrorBody {
        CloudErrorBody {
            code: self.code as u8,
            message: self.message.clone(),
        }
    }
}

pub const GRANT_TYPE_TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub const TOKEN_TYPE_ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
pub const TOKEN_TYPE_JWT: &str = "urn:ietf:params:oauth:token-type:jwt";
/// Lifetime of an access token (12 hours).
pub const ACCESS_TOKEN_LIFETIME_SECS: i64 = 43_200;
/// Longest lifetime of a token-exchange JWT (5 minutes).
pub const JWT_MAX_LIFETIME_SECS: i64 = 300;

/// The token exchange's form (`application/x-www-form-urlencoded`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TokenExchangeForm {
    /// `urn:ietf:params:oauth:grant-type:token-exchange`.
    pub grant_type: Option<String>,
    /// `urn:ietf:params:oauth:token-type:access_token`.
    pub requested_token_type: Option<String>,
    /// The RS256 JWT signed by an authorized key of the service account.
    pub subject_token: Option<String>,
    /// `urn:ietf:params:oauth:token-type:jwt`.
    pub subject_token_type: Option<String>,
}

impl TokenExchangeForm {
    /// Reads the form, refusing a field given twice.
    pub fn parse(body: &[u8]) -> Result<Self, CloudError> {
        let mut form = Self::default();
        for (name, value) in form_urlencoded::parse(body) {
            let slot = match name.as_ref() {
                "grant_type" => &mut form.grant_type,
                "requested_token_type" => &mut form.requested_token_type,
                "subject_token" => &mut form.subject_token,
                "subject_token_type" => &mut form.subject_token_type,
                _ => continue,
            };
            if slot.is_some() {
                return Err(CloudError::invalid(format!("`{name}` is given twice.")));
            }
            *slot = Some(value.into_owned());
        }
        Ok(form)
    }

    /// Checks the fixed fields; returns the subject token.
    pub fn subject_jwt(&self) -> Result<&str, CloudError> {
        let fixed = [
            ("grant_type", &self.grant_type, GRANT_TYPE_TOKEN_EXCHANGE),
            (
                "requested_token_type",
                &self.requested_token_type,
                TOKEN_TYPE_ACCESS_TOKEN,
            ),
            (
                "subject_token_type",
                &self.subject_token_type,
                TOKEN_TYPE_JWT,
            ),
        ];
        for (name, value, want) in fixed {
            match value.as_deref() {
                None | Some("") => {
                    return Err(CloudError::invalid(format!(
                        "`{name}` is required; it must be `{want}`."
                    )))
                }
                Some(v) if v != want => {
                    return Err(CloudError::invalid(format!(
                        "`{name}` must be `{want}`, not `{v}`."
                    )))
                }
                Some(_) => {}
            }
        }
        match self.subject_token.as_deref() {
            None | Some("") => Err(CloudError::invalid(
                "`subject_token` is required: the JWT signed with the service account's key.",
            )),
            Some(t) => Ok(t),
        }
    }
}

/// The token exchange's answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenExchangeResponse {
    pub access_token: String,
    /// `urn:ietf:params:oauth:token-type:access_token`.
    pub issued_token_type: String,
    /// `Bearer`.
    pub token_type: String,
    /// Seconds the token is valid: 43200.
    pub expires_in: i64,
}

/// A group of an account and its role.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GroupObject {
    pub id: String,
    pub name: String,
    /// `viewer`, `editor` or `admin`.
    pub role: String,
    pub account_id: String,
    pub created_at: i64,
    /// The ids of its member service accounts (in lists of groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
}

/// A service account.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceAccountObject {
    pub id: String,
    pub name: String,
    pub description: String,
    /// The account it belongs to: it acts in that account's projects.
    pub account_id: String,
    pub created_at: i64,
    pub groups: Vec<GroupObject>,
    /// Its strongest role, none when it is in no group.
    pub role: Option<String>,
}

/// `GET /iam/v1/profiles`: who the access token stands for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Profile {
    pub service_account_profile: ServiceAccountProfile,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceAccountProfile {
    pub info: ServiceAccountObject,
    /// The projects it acts in; the first is the default one.
    pub projects: Vec<String>,
    /// When the access token used for this call expires (seconds since the epoch).
    pub token_expires_at: i64,
}

/// `POST /iam/v1/serviceAccounts`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateServiceAccount {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// `viewer`, `editor` or `admin`: the account group it joins (default: none).
    #[serde(default)]
    pub role: Option<String>,
}

/// An authorized key (the public key itself is not repeated in lists).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuthorizedKeyObject {
    pub id: String,
    pub service_account_id: String,
    /// `RSA_4096`.
    pub algorithm: String,
    /// SHA-256 of the key's DER (SubjectPublicKeyInfo) encoding, hex.
    pub fingerprint: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// `active`, `expired` or `revoked`.
    pub status: String,
}

/// `POST /iam/v1/authorizedKeys`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadAuthorizedKey {
    pub service_account_id: String,
    /// PEM: `-----BEGIN PUBLIC KEY-----` (SubjectPublicKeyInfo) or
    /// `-----BEGIN RSA PUBLIC KEY-----` (PKCS#1); RSA, 4096 bits.
    pub public_key: String,
    /// Seconds since the epoch after which the key is refused.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

/// `POST /iam/v1/groups/{group_id}/members`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    pub service_account_id: String,
}

/// A list of cloud objects.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CloudList<T> {
    pub items: Vec<T>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_spec_statuses() {
        assert_eq!(CloudCode::Unauthenticated.status(), 401);
        assert_eq!(CloudCode::InvalidArgument.status(), 400);
        assert_eq!(CloudCode::PermissionDenied.status(), 403);
        assert_eq!(CloudCode::ResourceExhausted.status(), 429);
        assert_eq!(CloudCode::FailedPrecondition.status(), 400);
        assert_eq!(CloudCode::Aborted.status(), 409);
        assert_eq!(CloudCode::Cancelled.status(), 499);
        assert_eq!(CloudError::unauthenticated("x").body().code, 16);
    }

    fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs {
            s.append_pair(k, v);
        }
        s.finish().into_bytes()
    }

    #[test]
    fn the_exchange_form_is_checked() {
        let good = [
            ("grant_type", GRANT_TYPE_TOKEN_EXCHANGE),
            ("requested_token_type", TOKEN_TYPE_ACCESS_TOKEN),
            ("subject_token", "a.b.c"),
            ("subject_token_type", TOKEN_TYPE_JWT),
        ];
        let parsed = TokenExchangeForm::parse(&form(&good)).unwrap();
        assert_eq!(parsed.subject_jwt().unwrap(), "a.b.c");
        for drop in 0..good.len() {
            let partial: Vec<_> = good
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != drop)
                .map(|(_, p)| *p)
                .collect();
            let err = TokenExchangeForm::parse(&form(&partial))
                .unwrap()
                .subject_jwt()
                .unwrap_err();
            assert_eq!(err.code, CloudCode::InvalidArgument, "{:?}", good[drop]);
            assert!(err.message.contains(good[drop].0), "{}", err.message);
        }
        let mut wrong = good;
        wrong[0].1 = "client_credentials";
        let err = TokenExchangeForm::parse(&form(&wrong))
            .unwrap()
            .subject_jwt()
            .unwrap_err();
        assert!(err.message.contains("client_credentials"));
        let mut twice = good.to_vec();
        twice.push(("subject_token", "x"));
        assert_eq!(
            TokenExchangeForm::parse(&form(&twice)).unwrap_err().code,
            CloudCode::InvalidArgument
        );
    }
}
