//! HTTP routes, one module per endpoint family.

pub mod adapters;
pub mod admin;
pub mod batches;
pub mod chat;
mod chat_tools;
pub mod completions;
pub mod dataset_import;
pub mod dataset_uploads;
pub mod datasets;
pub mod embeddings;
pub mod endpoints;
pub mod files;
pub mod fine_tuning;
pub mod generate;
pub mod health;
pub mod images;
pub mod metrics;
pub mod models;
pub mod rerank;
pub mod responses;
mod responses_stream;
pub mod sse;
pub mod usage;
