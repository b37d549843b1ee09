-- Elections (session mode): one row per election, its current (or last) leader. The leader
-- is the session holding the election's own advisory key (never the key of the lock of the
-- same name); the row tells who it is (attempt, owner, the backend `pid` that holds the key),
-- the value it advertises with the sequence number of its last proclamation, and its
-- fencing token (drawn from `dlock_fence_seq` when it became leader). A row whose pid does
-- not hold the key in `pg_locks` is a past leader (`pid` is NULL once it resigned).
CREATE TABLE IF NOT EXISTS dlock_elections (
    ns text NOT NULL,
    name text NOT NULL,
    attempt text NOT NULL,
    owner text NOT NULL,
    pid integer,
    token bigint NOT NULL,
    value text NOT NULL,
    seq bigint NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name)
);
