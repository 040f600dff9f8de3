//! Datasets: typed tables uploaded in parts, stored as Parquet.
//!
//! [`schema`] names the column types and checks schemas; [`table`] turns a
//! part (JSON Lines, CSV or Parquet) into a checked Parquet file and reads
//! stored parts back (rows at an offset, streamed exports); `records` and
//! `uploads` keep the datasets' and the multipart uploads' rows (a dataset
//! is its ordered Parquet parts in the blob store, with their row counts).

mod records;
pub mod schema;
pub mod table;
mod uploads;

pub use records::{
    is_well_formed_dataset_id, Dataset, DatasetPatch, DatasetSort, NewDataset, StoredPart,
};
pub use uploads::{new_part_id, part_blob_key, NewUpload, Upload, UploadPart, UploadStatus};
