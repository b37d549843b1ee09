-- Resignation in lease mode: as lease_release.sql, on the election's row.
-- $1 ns, $2 name, $3 attempt, $4 token (NULL: any token of the attempt), $5 channel.
WITH u AS (
    UPDATE dlock_lease_elections
    SET owner = NULL, attempt = NULL, acquired_at = NULL, expires_at = 'epoch'
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND ($4::bigint IS NULL OR token = $4)
      AND owner IS NOT NULL AND expires_at > now()
    RETURNING 1
), n AS (
    SELECT pg_notify($5, '') FROM u
)
SELECT (SELECT count(*) FROM u) > 0,
       (SELECT attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now()
               AND NOT (attempt = $3 AND ($4::bigint IS NULL OR token = $4))
        FROM dlock_lease_elections WHERE ns = $1 AND name = $2),
       (SELECT count(*) FROM n)
