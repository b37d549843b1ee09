-- Records the leadership of attempt $3 on this session (which holds the election's advisory
-- key), with its value and a fresh fencing token (at least the server clock in microseconds,
-- above the election's last one), in one statement; sets the session's lease and wakes the
-- election's observers (delivered at commit). Idempotent per attempt and
-- session: a retry after a lost answer returns the recorded token and keeps the recorded
-- value and proclamation number, only extending the lease.
-- $1 ns, $2 name, $3 attempt, $4 owner, $5 lease ms, $6 idle timeout, $7 GUC, $8 value,
-- $9 channel.
WITH up AS (
    INSERT INTO dlock_elections AS e
        (ns, name, attempt, owner, pid, token, value, seq, acquired_at, expires_at)
    VALUES ($1, $2, $3, $4, pg_backend_pid(),
            GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
            $8, 0, now(),
            now() + $5 * interval '1 millisecond')
    ON CONFLICT (ns, name) DO UPDATE SET
        token = CASE WHEN e.attempt = $3 AND e.pid = pg_backend_pid()
                     THEN e.token
                     ELSE GREATEST(nextval('dlock_fence_seq'), e.token + 1,
                                   (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) END,
        value = CASE WHEN e.attempt = $3 AND e.pid = pg_backend_pid()
                     THEN e.value ELSE EXCLUDED.value END,
        seq = CASE WHEN e.attempt = $3 AND e.pid = pg_backend_pid() THEN e.seq ELSE 0 END,
        acquired_at = CASE WHEN e.attempt = $3 AND e.pid = pg_backend_pid()
                           THEN e.acquired_at ELSE now() END,
        expires_at = CASE WHEN e.attempt = $3 AND e.pid = pg_backend_pid()
                          THEN GREATEST(e.expires_at, EXCLUDED.expires_at)
                          ELSE EXCLUDED.expires_at END,
        attempt = EXCLUDED.attempt,
        owner = EXCLUDED.owner,
        pid = EXCLUDED.pid
    RETURNING e.token
)
SELECT (SELECT token FROM up), set_config($7, $6, false), pg_notify($9, '')
