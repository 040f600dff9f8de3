//! The console's stylesheet and script, compiled into the binary.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const ICON: &str = include_str!("assets/favicon.svg");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "max-age=300")],
        body,
    )
        .into_response()
}

/// `GET /console/assets/console.css`.
pub async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

/// `GET /console/assets/console.js`.
pub async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

/// `GET /console/assets/favicon.svg` (without it a browser asks for
/// `/favicon.ico` and logs the 404 on every page).
pub async fn icon() -> Response {
    asset("image/svg+xml", ICON)
}
