//! The store's one error type; the server maps it to HTTP in one place.

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The resource does not exist, or the caller's project cannot see it.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A running job still uses the resource.
    #[error("{0}")]
    InUse(String),
    /// An upload went over the size limit.
    #[error("the file is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// A value the caller gave is not acceptable (an unknown project, a bad URL).
    #[error("{0}")]
    Invalid(String),
    /// The client's upload stream failed before it ended.
    #[error("the upload was interrupted: {0}")]
    Interrupted(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("blob storage: {0}")]
    Blob(#[from] object_store::Error),
    #[error("blob storage: {0}")]
    Io(#[from] std::io::Error),
    /// A stored dataset part does not read or write as Parquet.
    #[error("dataset storage: {0}")]
    Table(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
