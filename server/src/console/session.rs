//! Signing in and out, the session cookie, and the CSRF check.
//!
//! The sign-in form is protected by a double-submit token (a random value
//! in a short-lived cookie and in the form, compared in constant time);
//! every later form carries the session's own CSRF token, kept in the
//! store with the session. The API key typed in is only looked up: it is
//! never stored in the browser, echoed back or kept beyond its hash.

use axum::extract::{FromRequestParts, State};
use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use hearth_store::console_sessions::ConsoleSession;
use maud::html;
use rand::RngCore;

use super::form::{self, Form};
use super::layout;
use crate::auth::RequestContext;
use crate::state::AppState;

/// The session cookie.
pub const COOKIE_NAME: &str = "hearth_console";
/// The sign-in form's double-submit cookie.
const SIGN_IN_COOKIE: &str = "hearth_console_sign_in";
/// How long a session lasts.
pub const SESSION_SECS: i64 = 12 * 3600;

/// The signed-in person of a console request.
#[derive(Debug, Clone)]
pub struct Session {
    /// The cookie's token (to switch projects and sign out).
    pub token: String,
    pub inner: ConsoleSession,
}

impl Session {
    /// The API's view of this session: its key, in its project.
    pub fn ctx(&self) -> RequestContext {
        RequestContext {
            caller: self.inner.caller.clone(),
            project_id: self.inner.project_id.clone(),
            project_named: true,
            priority: hearth_core::Priority::Interactive,
        }
    }

    pub fn csrf(&self) -> &str {
        &self.inner.csrf_token
    }

    pub fn is_admin(&self) -> bool {
        self.inner.caller.is_admin
    }

    pub fn account_id(&self) -> &str {
        self.inner.caller.account_id.as_deref().unwrap_or("")
    }

    /// The refusal of a form whose CSRF token is missing or not this
    /// session's (`None`: the token is good).
    pub fn refuse(&self, form: &Form) -> Option<Response> {
        let sent = form.raw("csrf");
        (!constant_time_eq(sent.as_bytes(), self.csrf().as_bytes())).then(csrf_refused)
    }
}

/// 403 page for a form without this session's token.
pub fn csrf_refused() -> Response {
    layout::message_page(
        StatusCode::FORBIDDEN,
        "Form refused",
        "This form did not carry this session's security token, so nothing was changed. \
         Reload the page and try again.",
    )
}

impl FromRequestParts<AppState> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Some(token) = cookie(&parts.headers, COOKIE_NAME) else {
            return Err(to_sign_in());
        };
        match state.store.console_session(&token).await {
            Ok(Some(inner)) => {
                crate::auth::note_key_use(state, &inner.caller);
                Ok(Session { token, inner })
            }
            Ok(None) => Err(to_sign_in()),
            Err(e) => Err(layout::error_page(crate::error::HttpError::from(e))),
        }
    }
}

fn to_sign_in() -> Response {
    Redirect::to("/console/sign-in").into_response()
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A `Set-Cookie` value scoped to the console (`Secure` when the server is
/// reached over TLS: `--public-url https://...` or a proxy's
/// `X-Forwarded-Proto: https`).
fn set_cookie(
    state: &AppState,
    headers: &HeaderMap,
    name: &str,
    value: &str,
    max_age: i64,
) -> HeaderValue {
    let tls = state
        .http
        .public_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"))
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            == Some("https");
    let secure = if tls { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("hearth_console_invalid=1; Max-Age=0"))
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `GET /console/sign-in`.
pub async fn sign_in_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let query = form::query(&uri);
    let notice = if query.has("revoked") {
        Some("The key you were signed in with is revoked, and its session with it. Sign in with another key.")
    } else {
        query.get("signed_out").map(|_| "You are signed out.")
    };
    sign_in_form(&state, &headers, StatusCode::OK, None, notice)
}

fn sign_in_form(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    error: Option<&str>,
    notice: Option<&str>,
) -> Response {
    let token = random_hex();
    let body = html! {
        section.narrow aria-labelledby="sign-in-title" {
            h1 #sign-in-title { "Sign in to Hearth" }
            @if let Some(notice) = notice { p.notice role="status" { (notice) } }
            p { "Sign in with an API key of this server (an admin key manages every project's keys). \
                 The key is checked once; the console then keeps a session and never shows the key again." }
            form method="post" action="/console/sign-in" {
                input type="hidden" name="csrf" value=(token);
                label for="key" { "API key" }
                input #key type="password" name="key" required autocomplete="off"
                    aria-describedby=[error.map(|_| "key-error")];
                @if let Some(error) = error { p #key-error .error role="alert" { (error) } }
                button type="submit" { "Sign in" }
            }
        }
    };
    let mut response = layout::bare_page(status, "Sign in", body);
    response.headers_mut().append(
        SET_COOKIE,
        set_cookie(state, headers, SIGN_IN_COOKIE, &token, 3600),
    );
    response
}

/// `POST /console/sign-in` `{csrf, key}`.
pub async fn sign_in(State(state): State<AppState>, headers: HeaderMap, form: Form) -> Response {
    let expected = cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !constant_time_eq(form.raw("csrf").as_bytes(), expected.as_bytes()) {
        return csrf_refused();
    }
    let key = form.raw("key").trim();
    let refuse =
        |status, message: &str| sign_in_form(&state, &headers, status, Some(message), None);
    if key.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "Enter an API key.");
    }
    if key.starts_with(hearth_store::iam::ACCESS_TOKEN_PREFIX) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "Access tokens of service accounts cannot sign in to the console; use an API key.",
        );
    }
    if state
        .api_keys
        .iter()
        .any(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
    {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "Keys given with --api-key cannot sign in to the console; use a stored key \
             (made with `hearth keys create`).",
        );
    }
    let caller = match state.store.authenticate(key).await {
        Ok(Some(caller)) => caller,
        Ok(None) => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "That API key is not valid for this server: it is unknown or revoked.",
            )
        }
        Err(e) => return layout::error_page(e.into()),
    };
    let Some(key_id) = caller.key_id else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "This key cannot sign in to the console.",
        );
    };
    let token = match state
        .store
        .create_console_session(&key_id, SESSION_SECS)
        .await
    {
        Ok(token) => token,
        Err(e) => return layout::error_page(e.into()),
    };
    tracing::info!(key = %key_id, "console sign-in");
    let mut response = Redirect::to("/console/keys").into_response();
    let h = response.headers_mut();
    h.append(
        SET_COOKIE,
        set_cookie(&state, &headers, COOKIE_NAME, &token, SESSION_SECS),
    );
    h.append(
        SET_COOKIE,
        set_cookie(&state, &headers, SIGN_IN_COOKIE, "", 0),
    );
    response
}

/// `POST /console/sign-out` `{csrf}`: deletes the session.
pub async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    session: Session,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    if let Err(e) = state.store.delete_console_session(&session.token).await {
        return layout::error_page(e.into());
    }
    let mut response = Redirect::to("/console/sign-in?signed_out=1").into_response();
    response
        .headers_mut()
        .append(SET_COOKIE, set_cookie(&state, &headers, COOKIE_NAME, "", 0));
    response
}
