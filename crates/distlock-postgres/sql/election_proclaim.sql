-- A numbered proclamation, on any connection (never the leader's session: it must not
-- restart that session's idle timer, the lease): the value and number change only if the
-- grant (attempt $3, token $4) still leads — its backend holds the election's key — and $5
-- is greater than the stored number; observers are woken (at commit) when they change. The
-- first column tells whether the grant leads, the second whether the value changed.
-- $1 ns, $2 name, $3 attempt, $4 token, $5 seq, $6 value, $7 channel, $8 classid, $9 objid.
WITH lead AS (
    SELECT 1 FROM dlock_elections e
    WHERE e.ns = $1 AND e.name = $2 AND e.attempt = $3 AND e.token = $4
      AND e.pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = e.pid
          AND l.classid = $8 AND l.objid = $9 AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
), u AS (
    UPDATE dlock_elections e SET value = $6, seq = $5
    WHERE e.ns = $1 AND e.name = $2 AND e.attempt = $3 AND e.token = $4 AND e.seq < $5
      AND EXISTS (SELECT 1 FROM lead)
    RETURNING 1
), n AS (
    SELECT pg_notify($7, '') FROM u
)
SELECT EXISTS (SELECT 1 FROM lead), (SELECT count(*) FROM n)
