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
	// 6: projects: every record belongs to one; tokens have a project, a
	// role, an expiry and a rate; warm pools are per project; the template
	// names a project built; the audit log.
	`
CREATE TABLE projects (
	name       TEXT PRIMARY KEY,
	created_at BIGINT NOT NULL,
	doc        TEXT NOT NULL
);
INSERT INTO projects(name, created_at, doc) VALUES ('default', 0, '{"name":"default","quotas":{},"created_at":"1970-01-01T00:00:00Z"}');
ALTER TABLE sandboxes ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX sandboxes_project ON sandboxes(project, state, seq);
ALTER TABLE operations ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX operations_project ON operations(project, seq);
ALTER TABLE snapshots ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX snapshots_project ON snapshots(project, seq);
ALTER TABLE tokens ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
ALTER TABLE tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'owner';
ALTER TABLE tokens ADD COLUMN expires_at BIGINT;
ALTER TABLE tokens ADD COLUMN rate_per_sec DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE tokens ADD COLUMN burst INTEGER NOT NULL DEFAULT 0;
CREATE TABLE warm_pools_p (
	project    TEXT NOT NULL,
	template   TEXT NOT NULL,
	min_ready  INTEGER NOT NULL,
	updated_at BIGINT NOT NULL,
	PRIMARY KEY (project, template)
);
INSERT INTO warm_pools_p(project, template, min_ready, updated_at) SELECT 'default', template, min_ready, updated_at FROM warm_pools;
DROP TABLE warm_pools;
ALTER TABLE warm_pools_p RENAME TO warm_pools;
CREATE TABLE template_owners (
	name       TEXT PRIMARY KEY,
	project    TEXT NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE audit (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at         BIGINT NOT NULL,
	project    TEXT NOT NULL,
	token_id   TEXT NOT NULL,
	action     TEXT NOT NULL,
	doc        TEXT NOT NULL
);
CREATE INDEX audit_project ON audit(project, seq);
`,
}
