-- A numbered proclamation in lease mode: the value and number change only if the grant
-- (attempt $3, token $4) still leads (its lease has not ended) and $5 is greater than the
-- stored number; observers are woken (at commit) when they change. Never touches the lease.
-- First column: the grant leads. $1 ns, $2 name, $3 attempt, $4 token, $5 seq, $6 value,
-- $7 channel.
WITH u AS (
    UPDATE dlock_lease_elections SET value = $6, seq = $5
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND token = $4 AND owner IS NOT NULL
      AND expires_at > now() AND seq < $5
    RETURNING 1
), n AS (
    SELECT pg_notify($7, '') FROM u
)
SELECT EXISTS (SELECT 1 FROM dlock_lease_elections
               WHERE ns = $1 AND name = $2 AND attempt = $3 AND token = $4
                 AND owner IS NOT NULL AND expires_at > now()),
       (SELECT count(*) FROM n)
