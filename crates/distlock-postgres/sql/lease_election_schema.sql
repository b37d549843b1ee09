-- Elections in lease mode: one row per election (apart from the lock rows, so an election
-- never conflicts with the lock of the same name), as dlock_leases, with the value the
-- leader advertises and the number of its last proclamation.
CREATE TABLE IF NOT EXISTS dlock_lease_elections (
    ns text NOT NULL,
    name text NOT NULL,
    owner text,
    attempt text,
    token bigint NOT NULL,
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL,
    value text NOT NULL,
    seq bigint NOT NULL,
    ended jsonb,
    PRIMARY KEY (ns, name)
);
ALTER TABLE dlock_lease_elections ADD COLUMN IF NOT EXISTS ended jsonb;
