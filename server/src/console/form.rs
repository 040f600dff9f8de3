//! URL-encoded form bodies, read without axum's plain-text rejections: a
//! body that cannot be read is an error page like any other.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::Response;

use super::layout;

/// A posted form's fields (the last value of a repeated name wins).
#[derive(Debug, Default)]
pub struct Form(HashMap<String, String>);

impl Form {
    pub fn parse(body: &[u8]) -> Self {
        Self(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// A field's value, trimmed; empty counts as absent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    /// A field's value as sent (untrimmed; for tokens and keys).
    pub fn raw(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or("")
    }

    /// Whether the field was sent at all (a bare `?name` counts).
    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Whether a checkbox was ticked.
    pub fn checked(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

impl<S: Send + Sync> FromRequest<S> for Form {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Form::parse(&bytes)),
            Err(rejection) => Err(layout::message_page(
                StatusCode::BAD_REQUEST,
                "The form could not be read",
                &format!("The form's data did not arrive whole: {rejection}"),
            )),
        }
    }
}

/// The query string's fields, parsed the same way.
pub fn query(uri: &axum::http::Uri) -> Form {
    Form::parse(uri.query().unwrap_or("").as_bytes())
}
