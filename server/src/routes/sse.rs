//! Server-sent events in the spec's framing: `data: <json>` and a blank line
//! per event, `data: [DONE]` last. Errors after the stream started are sent as
//! an error event, then `[DONE]`.

use std::convert::Infallible;
use std::future::Future;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use hearth_api::ApiError;
use serde::Serialize;
use tokio::sync::mpsc;

/// The producing side of an SSE response.
pub struct SseSender {
    tx: mpsc::Sender<Event>,
}

impl SseSender {
    /// Sends one `data: <json>` event; false when the client has gone.
    pub async fn json<T: Serialize>(&self, value: &T) -> bool {
        match serde_json::to_string(value) {
            Ok(data) => self.tx.send(Event::default().data(data)).await.is_ok(),
            Err(e) => {
                tracing::error!("cannot serialize a stream event: {e}");
                false
            }
        }
    }

    /// Sends the spec's error event.
    pub async fn error(&self, error: &ApiError) -> bool {
        self.json(&error.stream_event()).await
    }

    /// Sends `data: [DONE]`.
    pub async fn done(&self) {
        let _ = self.tx.send(Event::default().data("[DONE]")).await;
    }

    /// True once the client has disconnected.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Runs `producer` in its own task and streams what it sends. When the client
/// disconnects, the producer's next send fails and it stops, dropping the
/// engine streams it holds (which frees their sequences).
pub fn sse_response<F, Fut>(producer: F) -> Response
where
    F: FnOnce(SseSender) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(producer(SseSender { tx }));
    let events = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok::<_, Infallible>(ev), rx))
    });
    Sse::new(events).into_response()
}
