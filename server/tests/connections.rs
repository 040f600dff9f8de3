//! The real binary's connection handling: slow headers and idle keep-alive
//! connections are closed, SIGTERM drains and exits.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::temp_dir;

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";

fn start(extra: &[&str]) -> common::binary::Server {
    let mut args = vec!["--models", EMBED];
    args.extend_from_slice(extra);
    common::binary::start(&temp_dir(), &args)
}

fn connect(server: &common::binary::Server) -> TcpStream {
    let addr = server.base.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Reads until the peer closes; returns what came and how long it took.
fn read_to_close(stream: &mut TcpStream) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the connection stayed open: {e}"),
        }
    }
    (out, started.elapsed())
}

#[test]
fn slow_headers_and_idle_connections_are_closed() {
    let server = start(&["--header-timeout-secs", "1"]);
    // Headers that never end.
    let mut slow = connect(&server);
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (_, waited) = read_to_close(&mut slow);
    assert!(waited < Duration::from_secs(10), "{waited:?}");

    // A keep-alive connection left idle after one request.
    let mut idle = connect(&server);
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (reply, waited) = read_to_close(&mut idle);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");

    // The server still answers.
    let mut fresh = connect(&server);
    fresh
        .write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (reply, _) = read_to_close(&mut fresh);
    assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"));
}

#[test]
fn sigterm_drains_and_exits() {
    let mut server = start(&["--shutdown-timeout-secs", "3"]);
    // An idle keep-alive connection does not hold the shutdown up.
    let mut open = connect(&server);
    open.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    assert!(open.read(&mut buf).unwrap() > 0);
    let started = Instant::now();
    let pid = server.child.id() as i32;
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
