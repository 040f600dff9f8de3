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
/// disconnects, the producer is dropped at once, with the engine streams it
/// holds (which frees their sequences at the engine's next step), also while
/// it waits for a first token that a long prompt keeps back.
pub fn sse_response<F, Fut>(producer: F) -> Response
where
    F: FnOnce(SseSender) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(64);
    let watch = tx.clone();
    let producer = producer(SseSender { tx });
    tokio::spawn(async move {
        tokio::select! {
            () = producer => {}
            () = watch.closed() => {}
        }
    });
    let events = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok::<_, Infallible>(ev), rx))
    });
    Sse::new(events).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    /// Tells the test when it is dropped.
    struct Dropped(Option<oneshot::Sender<()>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    #[tokio::test]
    async fn a_producer_waiting_for_its_first_event_is_dropped_when_the_client_goes() {
        let (tx, dropped) = oneshot::channel();
        let response = sse_response(move |_sender| async move {
            let _guard = Dropped(Some(tx));
            // A prompt whose first token never comes.
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        drop(response);
        tokio::time::timeout(Duration::from_secs(5), dropped)
            .await
            .expect("the producer is dropped once the client has gone")
            .expect("the guard reports its drop");
    }

    #[tokio::test]
    async fn a_finished_producer_ends_the_stream() {
        use axum::body::to_bytes;
        let response = sse_response(|sender| async move {
            sender.json(&serde_json::json!({"a": 1})).await;
            sender.done().await;
        });
        let body = tokio::time::timeout(
            Duration::from_secs(5),
            to_bytes(response.into_body(), usize::MAX),
        )
        .await
        .expect("the body ends when the producer does")
        .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("data: {\"a\":1}") && text.contains("data: [DONE]"),
            "{text}"
        );
    }
}
