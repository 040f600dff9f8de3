-- The string pairs a client gave a fine-tuning job at creation (`metadata`,
-- a JSON object as TEXT), shown on the job.
ALTER TABLE fine_tuning_jobs ADD COLUMN metadata TEXT;
