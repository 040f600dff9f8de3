//! Sets `HEARTH_BUILD_ID` for the OpenAPI document's version: the short
//! git commit of the source tree, or the crate version outside a git
//! checkout (e.g. a packaged source). `HEARTH_BUILD_ID` in the build's
//! environment wins over both.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=HEARTH_BUILD_ID");
    // Rebuild when HEAD moves: HEAD itself, the branch it names, packed refs.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        // Branches live in the common folder (the same one outside worktrees).
        let common =
            git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]).unwrap_or(git_dir);
        println!("cargo:rerun-if-changed={common}/packed-refs");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={common}/{reference}");
        }
    }
    let id = std::env::var("HEARTH_BUILD_ID")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    println!("cargo:rustc-env=HEARTH_BUILD_ID={id}");
}
