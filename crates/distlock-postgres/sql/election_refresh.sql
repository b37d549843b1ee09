-- Renewal of a leadership (and a retried campaign of the leading attempt): the lease runs at
-- least $4 ms from now, never shorter; sets the session's lease. No row: the leadership was
-- revoked (or another session leads).
-- $1 ns, $2 name, $3 attempt, $4 lease ms, $5 idle timeout, $6 GUC.
WITH u AS (
    UPDATE dlock_elections
    SET expires_at = GREATEST(expires_at, now() + $4 * interval '1 millisecond')
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid()
    RETURNING 1
)
SELECT (SELECT count(*) FROM u), set_config($6, $5, false)
