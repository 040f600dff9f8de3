-- Adapters out and in. Each fine-tuning checkpoint publishes its PEFT files
-- as files of the job's project (purpose `fine-tune-results`), listed here
-- as a JSON list of file ids. LoRA adapters imported from outside (PEFT
-- folders) are registered per project and served like fine-tuned models;
-- their two files live in blobs under `adapters/<id>/`.

ALTER TABLE fine_tuning_checkpoints ADD COLUMN result_files TEXT NOT NULL DEFAULT '[]';

CREATE TABLE imported_adapters (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    name TEXT NOT NULL,
    base_model TEXT NOT NULL,
    model TEXT NOT NULL,
    details TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE UNIQUE INDEX imported_adapters_by_name ON imported_adapters (project_id, name);
