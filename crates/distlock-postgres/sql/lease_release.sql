-- Releases the grant of attempt $3 with token $4 (any token of that attempt when $4 is
-- NULL: a give-up, which does not know the token) and wakes waiters (the notification is
-- delivered when the statement commits). The second column tells, when nothing matched,
-- whether another grant holds the lock now (read from the statement's snapshot, which is
-- from before the update). $1 ns, $2 name, $3 attempt, $4 token, $5 channel.
WITH u AS (
    UPDATE dlock_leases SET owner = NULL, attempt = NULL, acquired_at = NULL, expires_at = 'epoch'
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND ($4::bigint IS NULL OR token = $4)
      AND owner IS NOT NULL AND expires_at > now()
    RETURNING 1
), n AS (
    SELECT pg_notify($5, '') FROM u
)
SELECT (SELECT count(*) FROM u) > 0,
       (SELECT attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now()
               AND NOT (attempt = $3 AND ($4::bigint IS NULL OR token = $4))
        FROM dlock_leases WHERE ns = $1 AND name = $2),
       (SELECT count(*) FROM n)
