//! The metadata database: one sqlx `Any` pool over SQLite or PostgreSQL, and
//! the embedded migrations (sqlx's migrator, tracked in `_sqlx_migrations`).

use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::{AnyPool, ConnectOptions, Connection};

use crate::error::{Result, StoreError};

/// The migrations, compiled in; each is plain SQL that both backends run.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "fine_tuning",
        include_str!("../migrations/0002_fine_tuning.sql"),
    ),
    (
        3,
        "fine_tuning_attempts",
        include_str!("../migrations/0003_fine_tuning_attempts.sql"),
    ),
    (
        4,
        "responses",
        include_str!("../migrations/0004_responses.sql"),
    ),
    (5, "batches", include_str!("../migrations/0005_batches.sql")),
    (
        6,
        "datasets",
        include_str!("../migrations/0006_datasets.sql"),
    ),
    (
        7,
        "endpoints",
        include_str!("../migrations/0007_endpoints.sql"),
    ),
    (8, "iam", include_str!("../migrations/0008_iam.sql")),
    (9, "usage", include_str!("../migrations/0009_usage.sql")),
    (
        10,
        "adapters",
        include_str!("../migrations/0010_adapters.sql"),
    ),
    (
        11,
        "console_sessions",
        include_str!("../migrations/0011_console_sessions.sql"),
    ),
    (12, "nodes", include_str!("../migrations/0012_nodes.sql")),
    (
        13,
        "import_claims",
        include_str!("../migrations/0013_import_claims.sql"),
    ),
    (
        14,
        "endpoint_claims",
        include_str!("../migrations/0014_endpoint_claims.sql"),
    ),
    (
        15,
        "fine_tuning_metadata",
        include_str!("../migrations/0015_fine_tuning_metadata.sql"),
    ),
    (
        16,
        "fine_tuned_model_deletion",
        include_str!("../migrations/0016_fine_tuned_model_deletion.sql"),
    ),
];

#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> BoxFuture<'static, Result<Vec<Migration>, Box<dyn std::error::Error + Send + Sync>>> {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|(version, name, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*name),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Self> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::Invalid(format!(
                "unsupported database URL `{}`: use sqlite://PATH or postgres://...",
                redact(url)
            )))
        }
    }
}

/// The default database: `<data-dir>/hearth.db`.
pub fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
}

/// Opens the pool and runs the migrations. SQLite databases are switched to
/// WAL (a setting kept in the file); sqlx turns foreign keys on for every
/// SQLite connection, and PostgreSQL always enforces them.
pub async fn open(url: &str) -> Result<(AnyPool, Backend)> {
    sqlx::any::install_default_drivers();
    let backend = Backend::of_url(url)?;
    // A SQLite URL without options creates its file when missing.
    let url = if backend == Backend::Sqlite && !url.contains('?') {
        format!("{url}?mode=rwc")
    } else {
        url.to_string()
    };
    let options: AnyConnectOptions = url.parse()?;
    if backend == Backend::Sqlite {
        let mut conn = options.connect().await?;
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut conn)
            .await?;
        conn.close().await?;
    }
    let pool = AnyPoolOptions::new()
        .max_connections(if backend == Backend::Sqlite { 4 } else { 8 })
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if backend == Backend::Sqlite {
                    sqlx::query("PRAGMA foreign_keys = ON")
                        .execute(conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await?;
    Migrator::new(Embedded).await?.run(&pool).await?;
    Ok((pool, backend))
}

/// A URL with its password hidden, for messages.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}
