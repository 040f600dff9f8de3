//! `hearth keys`, `hearth projects` and `hearth endpoints` against a
//! temporary data folder, through the built binary; `hearth serve` on a
//! taken address.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `hearth ARGS --data-dir DATA_DIR`, whatever its exit status.
fn run(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("HEARTH_DATABASE_URL")
        .env_remove("HEARTH_BLOB_URL")
        .output()
        .expect("running hearth")
}

/// The standard output of a run that must succeed.
fn hearth(data_dir: &Path, args: &[&str]) -> String {
    let output = run(data_dir, args);
    assert!(
        output.status.success(),
        "hearth {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn printed_key(output: &str) -> String {
    output
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("hearth-"))
        .unwrap_or_else(|| panic!("no key in {output:?}"))
        .to_string()
}

fn open(dir: &Path) -> hearth_store::Store {
    let dir = dir.to_path_buf();
    block_on(async move {
        hearth_store::Store::open(&hearth_store::StoreConfig {
            data_dir: dir,
            ..Default::default()
        })
        .await
        .unwrap()
    })
}

#[test]
fn keys_are_created_listed_and_revoked() {
    let dir = temp_dir();
    let out = hearth(&dir, &["keys", "create", "--name", "ci-bot"]);
    let key = printed_key(&out);
    assert_eq!(key.len(), "hearth-".len() + 64, "{key}");
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("key-"))
        .unwrap()
        .to_string();

    let list = hearth(&dir, &["keys", "list"]);
    let row = list.lines().find(|l| l.contains(&id)).expect(&list);
    assert!(row.contains("ci-bot") && row.contains(&key[..15]), "{row}");
    assert!(row.contains("never") && row.contains("active"), "{row}");
    assert!(!list.contains(&key), "a list never shows keys");
    // Each value starts under its heading (the prefix with its dots is
    // wider than a bare 16-column field).
    let header = list.lines().next().unwrap();
    for (heading, value) in [("PREFIX", &key[..15]), ("PROJECT", "project-")] {
        assert_eq!(
            header.find(heading),
            row.find(value),
            "{heading} misaligned:\n{list}"
        );
    }

    let store = open(&dir);
    let caller = block_on({
        let (store, key) = (store.clone(), key.clone());
        async move { store.authenticate(&key).await.unwrap() }
    });
    assert!(caller.is_some());

    let out = hearth(&dir, &["keys", "revoke", &id]);
    assert!(out.contains("Revoked"), "{out}");
    let list = hearth(&dir, &["keys", "list"]);
    assert!(
        list.lines()
            .find(|l| l.contains(&id))
            .unwrap()
            .contains("revoked"),
        "{list}"
    );
    let caller = block_on(async move { store.authenticate(&key).await.unwrap() });
    assert!(caller.is_none());

    // A second revoke says so and leaves the revocation time as it was.
    let again = hearth(&dir, &["keys", "revoke", &id]);
    assert!(again.contains("already revoked"), "{again}");
    assert_eq!(hearth(&dir, &["keys", "list"]), list);
}

#[test]
fn keys_can_be_made_for_a_project() {
    let dir = temp_dir();
    let project = hearth(&dir, &["projects", "create", "--name", "research"]);
    let project = project.trim();
    assert!(hearth_store::projects::is_well_formed(project), "{project}");
    let projects = hearth(&dir, &["projects", "list"]);
    assert!(
        projects.contains("research") && projects.contains("(default)"),
        "{projects}"
    );
    let out = hearth(
        &dir,
        &[
            "keys",
            "create",
            "--name",
            "r",
            "--project",
            project,
            "--admin",
        ],
    );
    assert!(out.contains(project) && out.contains("admin"), "{out}");
    let key = printed_key(&out);
    let store = open(&dir);
    let caller = block_on(async move { store.authenticate(&key).await.unwrap().unwrap() });
    assert!(caller.is_admin);
    assert_eq!(caller.default_project_id, project);

    let output = run(
        &dir,
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--project",
            "project-01J00000000000000000000000",
        ],
    );
    assert!(!output.status.success());
}

/// The CLI refuses blank names of keys and projects, as the API does.
#[test]
fn blank_names_are_refused() {
    let dir = temp_dir();
    for args in [
        ["keys", "create", "--name", " "],
        ["projects", "create", "--name", ""],
    ] {
        let output = run(&dir, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains("`name` must not be empty"), "{stderr}");
    }
    let store = open(&dir);
    assert!(block_on(async move { store.keys().await.unwrap() }).is_empty());
}

/// `hearth endpoints`: an endpoint made in the default project is listed
/// (a server loads it); an unknown project is refused by name and stores
/// nothing (it was a bare foreign-key failure); delete marks it.
#[test]
fn endpoints_are_created_listed_and_deleted() {
    let dir = temp_dir();
    let create = ["endpoints", "create", "--name", "e", "--model", "m"];
    let refused = run(
        &dir,
        &[
            &create[..],
            &["--flavor", "cpu-small", "--project", "project-nope"],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("no project with id `project-nope`"),
        "{stderr}"
    );

    let out = hearth(&dir, &[&create[..], &["--flavor", "cpu-small"]].concat());
    let (id, routing_key) = out.trim().split_once(' ').expect(&out);
    assert!(routing_key.starts_with("m:"), "{out}");
    let list = hearth(&dir, &["endpoints", "list"]);
    assert_eq!(list.lines().count(), 2, "one endpoint only:\n{list}");
    let row = list.lines().find(|l| l.starts_with(id)).expect(&list);
    assert!(
        row.contains("provisioning") && row.ends_with(routing_key),
        "{row}"
    );

    let out = hearth(&dir, &["endpoints", "delete", id]);
    assert!(out.contains("Deleting endpoint"), "{out}");
    assert!(!run(&dir, &["endpoints", "delete", "endpoint-nope"])
        .status
        .success());
}

/// `hearth serve` on an address another process holds fails at once,
/// naming it, before it pulls or loads any model (it used to pull and load
/// first: minutes, and here, with no models and no network, a pull error).
#[test]
fn serve_on_a_taken_address_fails_before_loading() {
    let dir = temp_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["serve", "--api-key", "k", "--port", &port, "--data-dir"])
        .arg(&dir)
        .env_remove("HEARTH_DATABASE_URL")
        .env_remove("HEARTH_BLOB_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running hearth");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("pulling"), "{stderr}");
    assert!(!dir.join("models").exists(), "nothing pulled");
    drop(taken);
}
