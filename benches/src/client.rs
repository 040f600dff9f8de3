//! One streamed HTTP/1.1 POST over plain TCP (hyper's connection-level
//! client): a fresh connection per request, as a simple client would open.

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where the server listens: `http://host[:port][/base]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or address, without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// Path prefix before `/v1/...`, without a trailing slash (often empty).
    pub base_path: String,
}

impl Target {
    /// Parses a base URL. Only plain `http` is supported.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url.parse().with_context(|| format!("bad URL {url:?}"))?;
        anyhow::ensure!(
            uri.scheme_str() == Some("http"),
            "only http:// URLs are supported, got {url:?}"
        );
        let host = uri
            .host()
            .with_context(|| format!("no host in {url:?}"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(80),
            base_path: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// The `Host` header value.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Opens a connection, sends `body` as JSON to `path` (appended to the base
/// path) asking for an event stream, and returns the response head with its
/// body still streaming.
pub async fn post_stream(
    target: &Target,
    path: &str,
    api_key: Option<&str>,
    body: Vec<u8>,
) -> anyhow::Result<Response<Incoming>> {
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .with_context(|| format!("connecting to {}", target.authority()))?;
    tcp.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .context("HTTP handshake")?;
    // Drives the connection until the response body is read or dropped.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = Request::post(format!("{}{}", target.base_path, path))
        .header(HOST, target.authority())
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "text/event-stream");
    if let Some(key) = api_key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::from(body)))?;
    sender
        .send_request(request)
        .await
        .context("sending the request")
}

/// The next piece of a streaming body; `None` at its end.
pub async fn next_data(body: &mut Incoming) -> Option<anyhow::Result<Bytes>> {
    loop {
        match body.frame().await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
                // Trailers: not data, keep reading.
            }
            Err(e) => return Some(Err(anyhow::Error::new(e).context("reading the body"))),
        }
    }
}

/// Up to `limit` bytes of a body as text (for error messages).
pub async fn read_prefix(body: &mut Incoming, limit: usize) -> String {
    let mut out = Vec::new();
    while out.len() < limit {
        match next_data(body).await {
            Some(Ok(data)) => out.extend_from_slice(&data),
            _ => break,
        }
    }
    out.truncate(limit);
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        let t = Target::parse("http://127.0.0.1:8091").unwrap();
        assert_eq!(
            t,
            Target {
                host: "127.0.0.1".into(),
                port: 8091,
                base_path: String::new()
            }
        );
        assert_eq!(t.authority(), "127.0.0.1:8091");
        let t = Target::parse("http://localhost/api/").unwrap();
        assert_eq!((t.port, t.base_path.as_str()), (80, "/api"));
        let t = Target::parse("http://[::1]:9000").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9000));
        assert_eq!(t.authority(), "[::1]:9000");
        assert!(Target::parse("https://example.com").is_err());
        assert!(Target::parse("not a url").is_err());
    }
}
