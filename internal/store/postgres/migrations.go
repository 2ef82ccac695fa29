package postgres

// migrations are applied in order; each runs once, in its own transaction,
// and is recorded in schema_migrations. Never edit a released migration: add
// a new one. They mirror SQLite's (package sqlite), one for one, so both
// databases are at the same version for the same binary.
var migrations = []string{
	// 1: sandboxes, operations, idempotency records, tokens.
	`
CREATE TABLE sandboxes (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT NOT NULL UNIQUE,
	state      TEXT NOT NULL,
	active_op  TEXT NOT NULL DEFAULT '',
	doc        TEXT NOT NULL
);
CREATE INDEX sandboxes_state ON sandboxes(state, seq);

CREATE TABLE operations (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT NOT NULL UNIQUE,
	sandbox_id TEXT NOT NULL,
	state      TEXT NOT NULL,
	from_state TEXT NOT NULL DEFAULT '',
	doc        TEXT NOT NULL
);
CREATE INDEX operations_sandbox ON operations(sandbox_id, seq);
CREATE INDEX operations_state ON operations(state, seq);

CREATE TABLE idempotency_keys (
	key         TEXT PRIMARY KEY,
	fingerprint TEXT NOT NULL,
	owner       TEXT NOT NULL,
	state       TEXT NOT NULL,
	status      INTEGER NOT NULL DEFAULT 0,
	body        BYTEA,
	location    TEXT NOT NULL DEFAULT '',
	created_at  BIGINT NOT NULL,
	expires_at  BIGINT NOT NULL
);
CREATE INDEX idempotency_expiry ON idempotency_keys(expires_at);

CREATE TABLE tokens (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	hash       TEXT NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	revoked_at BIGINT
);
`,
	// 2: warm pools: pool sandboxes are marked, and each template's wanted size.
	`
ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_pool ON sandboxes(pool, state, seq);
CREATE TABLE warm_pools (
	template   TEXT PRIMARY KEY,
	min_ready  INTEGER NOT NULL,
	updated_at BIGINT NOT NULL
);
`,
	// 3: snapshots of sandboxes.
	`
CREATE TABLE snapshots (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT NOT NULL UNIQUE,
	sandbox_id TEXT NOT NULL,
	name       TEXT NOT NULL DEFAULT '',
	state      TEXT NOT NULL,
	doc        TEXT NOT NULL
);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, seq);
`,
	// 4: snapshots tagged as templates.
	`
ALTER TABLE snapshots ADD COLUMN tag TEXT;
CREATE UNIQUE INDEX snapshots_tag ON snapshots(tag) WHERE tag IS NOT NULL;
`,
	// 5: cluster members (nodes and control replicas), and the node each
	// sandbox runs on.
	`
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_node ON sandboxes(node, state, seq);
CREATE TABLE members (
	id           TEXT PRIMARY KEY,
	role         TEXT NOT NULL,
	boot_id      TEXT NOT NULL,
	state        TEXT NOT NULL,
	heartbeat_at BIGINT NOT NULL,
	doc          TEXT NOT NULL
);
`,
}
