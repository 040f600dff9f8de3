-- How many times a worker claimed each fine-tuning job: a job whose worker
-- keeps dying is failed after a bounded number of attempts.
ALTER TABLE fine_tuning_jobs ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0;
