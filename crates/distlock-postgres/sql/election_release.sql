-- Resigns a leadership on its session: mark the row a past leader, unlock the election's
-- key once, wake waiting candidates (the server's queue) and observers (the NOTIFY), set the
-- session's lease to what its other grants need.
-- $1 ns, $2 name, $3 attempt, $4 key, $5 channel, $6 idle timeout, $7 GUC.
WITH d AS (UPDATE dlock_elections SET pid = NULL, expires_at = now()
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock($4), pg_notify($5, ''), set_config($7, $6, false)
