-- Gives back everything a session with no other grant may hold, as election_release.sql.
-- $1 ns, $2 name, $3 attempt, $4 key (unused), $5 channel, $6 idle timeout, $7 GUC.
WITH d AS (UPDATE dlock_elections SET pid = NULL, expires_at = now()
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock_all(), pg_notify($5, ''), set_config($7, $6, false)
