-- Each dedicated endpoint runs on one node at a time: the node that holds
-- its claim (renewed by every reconciler pass), how many replicas it has
-- serving (for nodes that do not run it), taken over by another node when
-- the claim goes stale.
ALTER TABLE dedicated_endpoints ADD COLUMN claimed_by TEXT;
ALTER TABLE dedicated_endpoints ADD COLUMN heartbeat_at BIGINT;
ALTER TABLE dedicated_endpoints ADD COLUMN ready_replicas BIGINT NOT NULL DEFAULT 0;
