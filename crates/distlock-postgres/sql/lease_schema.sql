-- The schema of lease mode (and the migration of an older table).
CREATE SEQUENCE IF NOT EXISTS dlock_fence_seq;
CREATE TABLE IF NOT EXISTS dlock_leases (
    ns text NOT NULL,
    name text NOT NULL,
    owner text,
    attempt text,
    token bigint NOT NULL,
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name)
);
ALTER TABLE dlock_leases ADD COLUMN IF NOT EXISTS attempt text;
ALTER TABLE dlock_leases DROP COLUMN IF EXISTS count;
