//! Playground: chat with a served model as the signed-in key, through the
//! chat API's own handler. Without JavaScript the form posts and the page
//! shows the answer; with it, the script posts the same form to
//! `/console/playground/stream` and shows the answer as it streams (the
//! key stays on the server: the session is the authority).

use axum::body::to_bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use hearth_api::ProjectQuery;
use maud::html;
use serde_json::{json, Value};

use super::form::Form;
use super::layout::{self, csrf_field, form_error, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::state::AppState;

/// Largest answer body read back for the page.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// `GET /console/playground`.
pub async fn page(State(state): State<AppState>, session: Session) -> Response {
    show(
        &state,
        &session,
        StatusCode::OK,
        &Form::default(),
        None,
        None,
    )
    .await
}

async fn show(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    entered: &Form,
    answer: Option<&str>,
    error: Option<&str>,
) -> Response {
    // The served chat models, then every adapter model the project may
    // use (the catalogue's, its fine-tuned models, its imports).
    let adapters =
        match crate::models_resolve::list_adapters(state, &session.inner.project_id).await {
            Ok(adapters) => adapters,
            Err(e) => return layout::error_page(e),
        };
    let models: Vec<&String> = state
        .chat
        .keys()
        .chain(
            adapters
                .iter()
                .filter(|a| state.chat.contains_key(&a.base))
                .map(|a| &a.id),
        )
        .collect();
    let body = html! {
        h1 { "Playground" }
        @if models.is_empty() {
            p { "This server serves no chat model (start it with one, e.g. `hearth serve --model ...`)." }
            (form_error("pg-error", error))
        } @else {
            form #playground method="post" action="/console/playground" {
                (csrf_field(session))
                label for="pg-model" { "Model" }
                select #pg-model name="model" { @for m in &models {
                    option value=(m) selected[entered.get("model") == Some(m.as_str())] { (m) } } }
                label for="pg-system" { "System message (optional)" }
                textarea #pg-system name="system" rows="2" { (entered.get("system").unwrap_or("")) }
                label for="pg-message" { "Message" }
                textarea #pg-message name="message" rows="4" required
                    aria-describedby=[error.map(|_| "pg-error")] { (entered.get("message").unwrap_or("")) }
                label for="pg-max" { "Most tokens in the answer" }
                input #pg-max name="max_tokens" type="number" min="1" max="4096" value=(entered.get("max_tokens").unwrap_or("256"));
                (form_error("pg-error", error))
                button type="submit" { "Send" }
            }
            section aria-labelledby="pg-answer-title" {
                h2 #pg-answer-title { "Answer" }
                pre #pg-answer aria-live="polite" { (answer.unwrap_or("")) }
            }
        }
    };
    render(
        state,
        session,
        Section::Playground,
        status,
        "Playground",
        body,
    )
    .await
}

/// The chat request a playground form asks for.
fn request(form: &Form, stream: bool) -> Result<Value, String> {
    let message = form.get("message").ok_or("Enter a message.")?;
    let mut messages = Vec::new();
    if let Some(system) = form.get("system") {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": message}));
    let mut request = json!({
        "model": form.get("model").unwrap_or(""),
        "messages": messages,
        "stream": stream,
    });
    if let Some(max) = form.get("max_tokens") {
        let max: u32 = max
            .parse()
            .map_err(|_| "The most tokens must be a whole number.")?;
        request["max_tokens"] = json!(max);
    }
    Ok(request)
}

/// Runs a request through `/v1/chat/completions`' handler as the session.
async fn chat(state: &AppState, session: &Session, request: Value) -> Result<Response, HttpError> {
    let parsed = hearth_api::parse_json_body(request.to_string().as_bytes()).map_err(HttpError)?;
    crate::routes::chat::create(
        State(state.clone()),
        ApiQuery(ProjectQuery::default()),
        Extension(session.ctx()),
        ApiJson(parsed),
    )
    .await
}

/// `POST /console/playground` `{csrf, model, system?, message, max_tokens?}`.
pub async fn send(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let answer = match request(&form, false) {
        Ok(request) => match chat(&state, &session, request).await {
            Ok(response) => match to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
                Ok(bytes) => Ok(serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| {
                        v["choices"][0]["message"]["content"]
                            .as_str()
                            .map(str::to_string)
                    })
                    .unwrap_or_default()),
                Err(_) => Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "The answer could not be read.".to_string(),
                )),
            },
            Err(e) => Err(layout::error_text(&e)),
        },
        Err(message) => Err((StatusCode::BAD_REQUEST, message)),
    };
    match answer {
        Ok(answer) => show(&state, &session, StatusCode::OK, &form, Some(&answer), None).await,
        Err((status, message)) => show(&state, &session, status, &form, None, Some(&message)).await,
    }
}

/// `POST /console/playground/stream`: the same form; the answer as the
/// chat API's server-sent events, or the reason in plain text.
pub async fn stream(State(state): State<AppState>, session: Session, form: Form) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let plain = |status: StatusCode, message: String| {
        (
            status,
            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
            message,
        )
            .into_response()
    };
    let request = match request(&form, true) {
        Ok(r) => r,
        Err(message) => return plain(StatusCode::BAD_REQUEST, message),
    };
    match chat(&state, &session, request).await {
        Ok(response) => response,
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            plain(status, message)
        }
    }
}
