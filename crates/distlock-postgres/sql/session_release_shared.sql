-- Releases one shared (read) grant on its session, as session_release_excl.sql.
-- $1 ns, $2 name, $3 attempt, $4 key, $5 channel, $6 idle timeout, $7 GUC.
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock_shared($4), pg_notify($5, ''), set_config($7, $6, false)
