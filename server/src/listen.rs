//! The accept loop: HTTP/1.1 connections through hyper with a limit on how
//! long a client may take to send a request's headers (which also closes
//! idle keep-alive connections), and a graceful drain on shutdown that
//! stops waiting for running requests after `--shutdown-timeout-secs`.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::config::HttpArgs;

/// Serves `app` on `listener` until `shutdown` completes, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    args: &HttpArgs,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(args.header_timeout_secs.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait, go on.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    drop(listener);
    let deadline = Duration::from_secs(args.shutdown_timeout_secs);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(deadline) => {
            tracing::warn!("shutdown deadline of {}s reached; closing the remaining connections", deadline.as_secs());
        }
    }
}
