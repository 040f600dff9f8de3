-- When the client deleted a succeeded job's fine-tuned model (seconds since
-- the epoch; NULL while it exists). The job keeps its `fine_tuned_model`
-- name; the model is no longer listed, retrieved or served.
ALTER TABLE fine_tuning_jobs ADD COLUMN model_deleted_at BIGINT;
