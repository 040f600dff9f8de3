//! The store tests' harness: a store on SQLite in a temporary folder, or on
//! PostgreSQL in a fresh database when `HEARTH_TEST_DATABASE_URL` names a
//! server (`scripts/test` starts one), and `on_both!` to run each test on
//! both.

use hearth_store::{Store, StoreConfig};

pub struct Env {
    pub store: Store,
    _dir: tempfile::TempDir,
}

pub async fn sqlite() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&StoreConfig {
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    })
    .await
    .unwrap();
    Env { store, _dir: dir }
}

pub async fn postgres() -> Option<Env> {
    let base = std::env::var("HEARTH_TEST_DATABASE_URL").ok()?;
    sqlx::any::install_default_drivers();
    let name = format!(
        "hearth_test_{}",
        hearth_store::ids::new_id("t")
            .to_lowercase()
            .replace('-', "_")
    );
    let mut url = url::Url::parse(&base).expect("HEARTH_TEST_DATABASE_URL is a URL");
    url.set_path(&name);
    use sqlx::migrate::MigrateDatabase;
    sqlx::Any::create_database(url.as_str())
        .await
        .expect("creating a test database");
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&StoreConfig {
        data_dir: dir.path().to_path_buf(),
        database_url: Some(url.to_string()),
        blob_url: None,
    })
    .await
    .unwrap();
    assert_eq!(store.backend(), hearth_store::Backend::Postgres);
    Some(Env { store, _dir: dir })
}

/// Runs each named test on SQLite, and on PostgreSQL when configured.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::sqlite().await).await } )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    match super::postgres().await {
                        Some(env) => super::$name(env).await,
                        None => eprintln!("HEARTH_TEST_DATABASE_URL is not set; skipped on PostgreSQL"),
                    }
                }
            )*
        }
    };
}
