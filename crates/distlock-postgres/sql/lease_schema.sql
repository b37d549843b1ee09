-- The schema of lease mode (and the migration of an older table). `ended` records the
-- attempts that ended (gave up, released) after one of their requests went unanswered, as
-- {attempt: until, in epoch seconds}: a late copy of such a request never grants them.
CREATE SEQUENCE IF NOT EXISTS dlock_fence_seq;
CREATE TABLE IF NOT EXISTS dlock_leases (
    ns text NOT NULL,
    name text NOT NULL,
    owner text,
    attempt text,
    token bigint NOT NULL,
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL,
    ended jsonb,
    PRIMARY KEY (ns, name)
);
ALTER TABLE dlock_leases ADD COLUMN IF NOT EXISTS ended jsonb;
ALTER TABLE dlock_leases ADD COLUMN IF NOT EXISTS attempt text;
ALTER TABLE dlock_leases DROP COLUMN IF EXISTS count;
