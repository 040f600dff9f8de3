//! A cookie-keeping client of the console over the in-process router, for
//! the console's tests (each uses part of it); the browser tests' support
//! in [`browser`] (a state with a tiny image model is in `common::images`).

#![allow(dead_code)]

pub mod browser;

use std::collections::HashMap;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use hearth_server::AppState;

/// One answer: status, `Location`, `Set-Cookie` lines and the body.
pub struct Page {
    pub status: StatusCode,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub content_type: String,
    pub text: String,
}

impl Page {
    /// The first `name="csrf" value="..."` of the page's forms.
    pub fn csrf(&self) -> String {
        let marker = r#"name="csrf" value=""#;
        let start = self
            .text
            .find(marker)
            .unwrap_or_else(|| panic!("no CSRF field: {}", self.text))
            + marker.len();
        let end = self.text[start..].find('"').unwrap() + start;
        self.text[start..end].to_string()
    }
}

/// A browser's part: cookies (by name) sent back with every request.
#[derive(Clone)]
pub struct Client {
    pub state: AppState,
    pub cookies: HashMap<String, String>,
}

impl Client {
    pub fn new(state: &AppState) -> Self {
        Self {
            state: state.clone(),
            cookies: HashMap::new(),
        }
    }

    pub async fn request(
        &mut self,
        method: &str,
        uri: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Page {
        let mut builder = Request::builder().method(method).uri(uri);
        if !self.cookies.is_empty() {
            let cookie = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ");
            builder = builder.header("cookie", cookie);
        }
        if let Some(ct) = content_type {
            builder = builder.header("content-type", ct);
        }
        let response = hearth_server::app(self.state.clone())
            .oneshot(builder.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let location = header("location");
        let content_type = header("content-type").unwrap_or_default();
        let set_cookies: Vec<String> = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        for line in &set_cookies {
            let pair = line.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() || line.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_string(), value.to_string());
            }
        }
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Page {
            status,
            location,
            set_cookies,
            content_type,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    pub async fn get(&mut self, uri: &str) -> Page {
        self.request("GET", uri, None, Vec::new()).await
    }

    /// Posts a URL-encoded form.
    pub async fn post(&mut self, uri: &str, fields: &[(&str, &str)]) -> Page {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.request(
            "POST",
            uri,
            Some("application/x-www-form-urlencoded"),
            body.into_bytes(),
        )
        .await
    }

    /// Posts a multipart form: `fields` in order, then `file`.
    pub async fn post_multipart(
        &mut self,
        uri: &str,
        fields: &[(&str, &str)],
        file: (&str, &[u8]),
    ) -> Page {
        let boundary = "console-test-boundary";
        let mut body = Vec::new();
        for (name, value) in fields {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
            );
        }
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n",
                file.0
            )
            .as_bytes(),
        );
        body.extend_from_slice(file.1);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        self.request(
            "POST",
            uri,
            Some(&format!("multipart/form-data; boundary={boundary}")),
            body,
        )
        .await
    }

    /// Signs in with `key`; panics unless it works.
    pub async fn sign_in(&mut self, key: &str) -> Page {
        let form = self.get("/console/sign-in").await;
        assert_eq!(form.status, StatusCode::OK);
        let page = self
            .post("/console/sign-in", &[("csrf", &form.csrf()), ("key", key)])
            .await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
        assert_eq!(page.location.as_deref(), Some("/console/keys"));
        page
    }

    /// The CSRF token of the session (from the keys page).
    pub async fn csrf(&mut self) -> String {
        let page = self.get("/console/keys").await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        page.csrf()
    }
}

/// A stored key: (secret, id).
pub async fn stored_key(state: &AppState, name: &str, admin: bool) -> (String, String) {
    let new = state.store.create_key(name, None, admin).await.unwrap();
    (new.secret, new.info.id)
}

/// A client signed in with a new non-admin key named `name`, and its
/// session's CSRF token.
pub async fn signed_in(state: &AppState, name: &str) -> (Client, String) {
    let (secret, _) = stored_key(state, name, false).await;
    let mut browser = Client::new(state);
    browser.sign_in(&secret).await;
    let csrf = browser.csrf().await;
    (browser, csrf)
}
