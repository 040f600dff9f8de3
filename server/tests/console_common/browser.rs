//! The console in headless Chromium over WebDriver (fantoccini), for the
//! browser tests: the driver, a session, screenshots, waits, and keys.
//!
//! The WebDriver server is `HEARTH_TEST_WEBDRIVER_URL` (`scripts/test`
//! starts chromedriver and sets it), else a `chromedriver` on the PATH
//! started here; without either a test says so and does nothing.

use std::future::{Future, IntoFuture};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use hearth_server::AppState;
use serde_json::json;

/// A chromedriver started by this test; killed when dropped.
pub struct Driver {
    child: Option<Child>,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The WebDriver server, or `None` (the test is then skipped).
pub fn webdriver() -> Option<Driver> {
    if let Ok(url) = std::env::var("HEARTH_TEST_WEBDRIVER_URL") {
        return Some(Driver { child: None, url });
    }
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let driver = Driver {
        child: Some(child),
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(driver)
}

/// A new headless Chromium session, 1280x800.
pub async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--window-size=1280,800", "--no-first-run", "--disable-extensions"]}),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session of headless Chromium")
}

/// Serves `state`'s app on a free port; its `http://` base.
pub async fn serve(state: &AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, hearth_server::app(state.clone())).into_future());
    base
}

/// Runs `steps` with the browser, then closes its session whatever
/// happened (no Chromium left behind), and fails as they failed.
pub async fn closing(c: &Client, steps: impl Future<Output = ()>) {
    let outcome = std::panic::AssertUnwindSafe(steps).catch_unwind().await;
    let _ = c.clone().close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Numbered screenshots in `<target>/tmp/<name>/` (emptied first).
pub struct Shots {
    pub dir: PathBuf,
    pub n: usize,
}

impl Shots {
    pub fn new(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir, n: 0 }
    }

    pub async fn take(&mut self, c: &Client, name: &str) {
        self.n += 1;
        let png = c.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(self.dir.join(format!("{:02}-{name}.png", self.n)), png).unwrap();
    }
}

/// The page's path and query.
pub async fn path_of(c: &Client) -> String {
    let url = c.current_url().await.unwrap();
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    }
}

/// Waits (up to 10 s) until the page's path is `path`.
pub async fn wait_path(c: &Client, path: &str) {
    wait_until(c, path, |now| now == path).await
}

/// Waits (up to 10 s) until the page's path starts with `prefix`.
pub async fn wait_prefix(c: &Client, prefix: &str) {
    wait_until(c, prefix, |now| now.starts_with(prefix)).await
}

async fn wait_until(c: &Client, what: &str, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = path_of(c).await;
        if done(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "still at {now}, expected {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The element at `css`, waiting (up to 10 s) for a page still loading.
pub async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

pub async fn click(c: &Client, css: &str) {
    find(c, css).await.click().await.unwrap();
}

pub async fn fill(c: &Client, css: &str, text: &str) {
    let field = find(c, css).await;
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

/// Types `text` (keys of [`Key`] included) into the focused element, as
/// a keyboard does: no element is picked by the test.
pub async fn type_here(c: &Client, text: &str) {
    c.active_element()
        .await
        .unwrap()
        .send_keys(text)
        .await
        .unwrap();
}

/// Presses and releases `key` wherever the focus is (the keyboard itself:
/// works on file inputs too, where typing would name a file).
pub async fn press(c: &Client, key: Key) {
    let keys = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: key.into() })
        .then(KeyAction::Up { value: key.into() });
    c.perform_actions(keys).await.unwrap();
}

/// Whether the focused element matches `css`.
pub async fn focus_is(c: &Client, css: &str) -> bool {
    c.execute(
        "return !!document.activeElement && document.activeElement.matches(arguments[0])",
        vec![json!(css)],
    )
    .await
    .unwrap()
        == json!(true)
}

/// Presses Tab (typed into the focused element) until the focus is on
/// `css`; fails after 60 presses.
pub async fn tab_to(c: &Client, css: &str) {
    for _ in 0..60 {
        if focus_is(c, css).await {
            return;
        }
        type_here(c, &Key::Tab.to_string()).await;
    }
    let at = c
        .execute("return document.activeElement.outerHTML", vec![])
        .await
        .unwrap();
    panic!("Tab never reached {css}; the focus is on {at}");
}
