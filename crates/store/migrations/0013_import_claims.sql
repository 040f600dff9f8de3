-- Imports from object storage are claimed by one node at a time, like
-- fine-tuning jobs and batches: the claiming node's id, its last heartbeat,
-- and how many times a node claimed it (an import that kills its node
-- every time is failed after a bounded number of attempts).
ALTER TABLE dataset_uploads ADD COLUMN claimed_by TEXT;
ALTER TABLE dataset_uploads ADD COLUMN heartbeat_at BIGINT;
ALTER TABLE dataset_uploads ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0;
