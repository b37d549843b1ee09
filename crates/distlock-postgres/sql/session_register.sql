-- Records the grant of attempt $3 on this session and returns its fencing token; also sets
-- the session's lease. Idempotent per attempt and session: if this session already recorded
-- the attempt's grant (a retry after the answer was lost), it returns that token and only
-- extends the lease, drawing no new token. A new token is at least the server clock in
-- microseconds and above the name's last one (a sequence and a row set back by a restore or a
-- failover never hand out a token again). An exclusive grant removes rows of other sessions
-- (stale: nobody else can hold the key now).
-- $1 ns, $2 name, $3 attempt, $4 owner, $5 lease ms, $6 idle timeout, $7 GUC, $8 kind,
-- $9 exclusive (the parameters of election_register.sql up to $7).
WITH old AS (
    SELECT token FROM dlock_holders
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid()
), f AS (
    INSERT INTO dlock_fence AS f (ns, name, token)
    SELECT $1, $2,
           GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
    WHERE NOT EXISTS (SELECT 1 FROM old)
    ON CONFLICT (ns, name) DO UPDATE
    SET token = GREATEST(nextval('dlock_fence_seq'), f.token + 1,
                         (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
    RETURNING f.token
), d AS (
    DELETE FROM dlock_holders
    WHERE ns = $1 AND name = $2 AND $9 AND pid <> pg_backend_pid() AND attempt <> $3
), ins AS (
    INSERT INTO dlock_holders AS h
        (ns, name, attempt, owner, kind, token, pid, acquired_at, expires_at)
    SELECT $1, $2, $3, $4, $8, f.token, pg_backend_pid(), now(),
           now() + $5 * interval '1 millisecond'
    FROM f
    ON CONFLICT (ns, name, attempt) DO UPDATE
    SET owner = EXCLUDED.owner, kind = EXCLUDED.kind, token = EXCLUDED.token, pid = EXCLUDED.pid,
        acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
    RETURNING h.token
), ext AS (
    UPDATE dlock_holders h
    SET expires_at = GREATEST(h.expires_at, now() + $5 * interval '1 millisecond')
    WHERE h.ns = $1 AND h.name = $2 AND h.attempt = $3 AND h.pid = pg_backend_pid()
    RETURNING h.token
)
SELECT COALESCE((SELECT token FROM ins), (SELECT token FROM ext)), set_config($7, $6, false)
