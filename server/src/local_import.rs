//! Reading a `file://` dataset import safely. A URL's text being under an
//! allowed prefix is not enough: a symbolic link below the prefix may lead
//! anywhere, the server's own database included (and a read of SQLite's
//! file by this process, once closed, drops SQLite's locks on it). So the
//! file read is the one the URL names with every link resolved, and only
//! when that real path is under an allowed `file://` prefix (itself
//! resolved) and outside the server's own files: its data folder, its
//! SQLite database and its blob folder. The path is checked before the file
//! is opened, opened without following a last link, and on Linux checked
//! again through the open handle, so a link swapped in between is caught.
//! A file with other hard links on the filesystem of the server's own files
//! is refused too: it may be one of them under another name.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where imports may read and what they may never read.
#[derive(Debug, Clone, Default)]
pub struct LocalPaths {
    /// The `--dataset-import-allow` prefixes (only `file://` ones matter).
    pub allow: Vec<String>,
    /// The server's own files: folders and files refused with all below
    /// them (and a database file's `-wal`, `-shm`, `-journal` siblings).
    pub private: Vec<PathBuf>,
}

impl LocalPaths {
    /// The server's own files for a store at `data_dir` with these URLs.
    pub fn private_of(
        data_dir: &Path,
        database_url: Option<&str>,
        blob_url: Option<&str>,
    ) -> Vec<PathBuf> {
        let mut private = vec![data_dir.to_path_buf()];
        if let Some(url) = database_url {
            if let Some(rest) = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
            {
                let path = rest.split('?').next().unwrap_or(rest);
                if !path.is_empty() && path != ":memory:" {
                    private.push(PathBuf::from(path));
                }
            }
        }
        if let Some(path) = blob_url
            .and_then(|u| url::Url::parse(u).ok())
            .filter(|u| u.scheme() == "file")
            .and_then(|u| u.to_file_path().ok())
        {
            private.push(path);
        }
        private
    }

    /// Whether the real path `real` may be read.
    fn readable(&self, real: &Path) -> bool {
        let text = real.to_string_lossy();
        let allowed = self
            .allow
            .iter()
            .any(|prefix| resolved_prefix(prefix).is_some_and(|p| text.starts_with(p.as_str())));
        let private = self.private.iter().any(|p| {
            let p = resolve(p);
            let own = format!("{}-", p.to_string_lossy());
            real.starts_with(&p) || text.starts_with(&own)
        });
        allowed && !private
    }

    /// Whether the file with `meta` has other hard links on a filesystem
    /// that holds the server's own files: it may be one of them under
    /// another name (paths cannot tell).
    #[cfg(unix)]
    fn may_be_a_hard_link_to_ours(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        meta.nlink() > 1
            && self
                .private
                .iter()
                .any(|p| std::fs::metadata(resolve(p)).is_ok_and(|own| own.dev() == meta.dev()))
    }

    #[cfg(not(unix))]
    fn may_be_a_hard_link_to_ours(&self, _meta: &std::fs::Metadata) -> bool {
        false
    }

    /// Copies the file `url` names into `dest` (at most `limit` bytes);
    /// the error is for the upload's `error` (it names the URL as given,
    /// never the path a link led to).
    pub fn download(&self, url: &url::Url, dest: &Path, limit: u64) -> Result<u64, String> {
        let path = url
            .to_file_path()
            .map_err(|_| format!("`{url}` is not a file path"))?;
        let real = std::fs::canonicalize(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("`{url}` does not exist"),
            _ => format!("reading `{url}`: {e}"),
        })?;
        let outside = || {
            format!(
                "`{url}` cannot be imported: with its links resolved it is not a file under \
                 the prefixes this server imports from, or it is one of the server's own files"
            )
        };
        if !self.readable(&real) {
            return Err(outside());
        }
        let not_a_file = || format!("`{url}` is not a file");
        if !std::fs::metadata(&real)
            .map_err(|e| e.to_string())?
            .is_file()
        {
            return Err(not_a_file());
        }
        let mut file = open_no_follow(&real).map_err(|e| format!("reading `{url}`: {e}"))?;
        if opened_path(&file).is_some_and(|opened| opened != real) {
            return Err(outside());
        }
        let meta = file.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err(not_a_file());
        }
        if self.may_be_a_hard_link_to_ours(&meta) {
            return Err(outside());
        }
        let too_large = || format!("`{url}` is larger than the limit of {limit} bytes");
        if meta.len() > limit {
            return Err(too_large());
        }
        let mut out = std::fs::File::create(dest).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut written = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("reading `{url}`: {e}"))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            if written > limit {
                return Err(too_large());
            }
            out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        }
        out.flush().map_err(|e| e.to_string())?;
        Ok(written)
    }
}

/// `path` with its links resolved when it exists (else its parent's, else
/// as given).
fn resolve(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// A `file://` prefix as a resolved path's text (keeping a final `/`, so
/// that `file:///srv/data/` does not match `/srv/database`); `None` for
/// other schemes.
fn resolved_prefix(prefix: &str) -> Option<String> {
    let url = url::Url::parse(prefix)
        .ok()
        .filter(|u| u.scheme() == "file")?;
    let path = url.to_file_path().ok()?;
    let mut text = resolve(&path).to_string_lossy().into_owned();
    if prefix.ends_with('/') && !text.ends_with('/') {
        text.push('/');
    }
    Some(text)
}

/// Opens `path` for reading, refusing a last component that is a link and
/// not waiting on a FIFO.
#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// The real path of an open file, where the system tells it.
#[cfg(target_os = "linux")]
fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

#[cfg(not(target_os = "linux"))]
fn opened_path(_file: &std::fs::File) -> Option<PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(path: &Path) -> url::Url {
        url::Url::from_file_path(path).unwrap()
    }

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_prefix_and_the_servers_files_are_refused() {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let imports = root.path().join("imports");
        let data = root.path().join("data");
        let outside = root.path().join("outside");
        for dir in [&imports, &data, &outside] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(imports.join("ok.csv"), "a\n1\n").unwrap();
        std::fs::write(data.join("hearth.db"), "SQLite format 3").unwrap();
        std::fs::write(outside.join("secret.csv"), "a\nsecret\n").unwrap();
        symlink(&data, imports.join("datalink")).unwrap();
        symlink(outside.join("secret.csv"), imports.join("secret.csv")).unwrap();
        symlink(imports.join("ok.csv"), imports.join("alias.csv")).unwrap();
        let paths = LocalPaths {
            allow: vec![format!("{}/", url(&imports))],
            private: LocalPaths::private_of(&data, None, None),
        };
        let dest = root.path().join("copy");
        assert_eq!(
            paths.download(&url(&imports.join("ok.csv")), &dest, 100),
            Ok(4)
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"a\n1\n");
        // A link that stays inside the prefix is fine.
        assert_eq!(
            paths.download(&url(&imports.join("alias.csv")), &dest, 100),
            Ok(4)
        );
        for escape in [
            imports.join("datalink/hearth.db"),
            imports.join("secret.csv"),
        ] {
            let e = paths.download(&url(&escape), &dest, 100).unwrap_err();
            assert!(e.contains("cannot be imported"), "{e}");
            assert!(!e.contains("outside/") && !e.contains("data/"), "{e}");
        }
        // The data folder under an allowed prefix is still refused.
        let wide = LocalPaths {
            allow: vec![format!("{}/", url(root.path()))],
            ..paths.clone()
        };
        assert!(wide
            .download(&url(&data.join("hearth.db")), &dest, 100)
            .is_err());
        assert_eq!(
            wide.download(&url(&outside.join("secret.csv")), &dest, 100),
            Ok(9)
        );
        // A hard link to the server's file is another name for it.
        std::fs::hard_link(data.join("hearth.db"), imports.join("hard.csv")).unwrap();
        let e = paths
            .download(&url(&imports.join("hard.csv")), &dest, 100)
            .unwrap_err();
        assert!(e.contains("cannot be imported"), "{e}");
        // Missing files, folders and files over the limit.
        let e = paths
            .download(&url(&imports.join("nope.csv")), &dest, 100)
            .unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = paths.download(&url(&imports), &dest, 100).unwrap_err();
        assert!(
            e.contains("cannot be imported") || e.contains("not a file"),
            "{e}"
        );
        let e = paths
            .download(&url(&imports.join("ok.csv")), &dest, 3)
            .unwrap_err();
        assert!(e.contains("larger than the limit of 3 bytes"), "{e}");
    }

    #[test]
    fn the_servers_files_follow_its_store_urls() {
        let private = LocalPaths::private_of(
            Path::new("/srv/hearth"),
            Some("sqlite:///var/db/h.db?mode=rwc"),
            Some("file:///mnt/blobs"),
        );
        assert_eq!(
            private,
            [
                PathBuf::from("/srv/hearth"),
                PathBuf::from("/var/db/h.db"),
                PathBuf::from("/mnt/blobs")
            ]
        );
        let private = LocalPaths::private_of(
            Path::new("/srv/hearth"),
            Some("postgres://u@h/db"),
            Some("s3://bucket/p"),
        );
        assert_eq!(private, [PathBuf::from("/srv/hearth")]);
        let paths = LocalPaths {
            allow: vec!["file:///var/".into()],
            private: vec![PathBuf::from("/var/db/h.db")],
        };
        assert!(!paths.readable(Path::new("/var/db/h.db-wal")));
        assert!(!paths.readable(Path::new("/var/db/h.db")));
        assert!(paths.readable(Path::new("/var/db/other.csv")));
        assert!(!paths.readable(Path::new("/srv/x.csv")));
    }
}
