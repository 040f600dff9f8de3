//! The Hearth server: CLI configuration, the axum app and its routes.

pub mod app;
pub mod auth;
pub mod batch_endpoints;
pub mod config;
pub mod console;
pub mod dataset_imports;
pub mod endpoints;
pub mod endpoints_cli;
pub mod error;
pub mod fine_tuned;
pub mod forward;
pub mod iam;
pub mod iam_cli;
pub mod imported_adapters;
pub mod keys_cli;
pub mod layers;
pub mod limits;
pub mod listen;
pub mod local_import;
pub mod malloc;
pub mod models_cli;
pub mod models_resolve;
pub mod nodes;
pub mod openapi;
pub mod routes;
pub mod serve;
pub mod state;
pub mod usage;
pub mod usage_cli;

pub use app::app;
pub use state::AppState;
