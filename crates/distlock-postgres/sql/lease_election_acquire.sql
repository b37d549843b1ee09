-- Campaign in lease mode: as lease_acquire.sql, on the election's row, storing the value
-- with the grant (seq 0) in the same statement, and waking observers and waiting candidates
-- (at commit) when granted. A retry of the leading attempt keeps its token, value and seq
-- and never shortens the lease; an attempt recorded in `ended` is never granted.
-- $1 ns, $2 name, $3 owner, $4 attempt, $5 lease ms, $6 value, $7 channel.
WITH up AS (
    INSERT INTO dlock_lease_elections AS l
        (ns, name, owner, attempt, token, acquired_at, expires_at, value, seq)
    VALUES ($1, $2, $3, $4,
            GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
            now(),
            now() + $5 * interval '1 millisecond', $6, 0)
    ON CONFLICT (ns, name) DO UPDATE SET
        owner = EXCLUDED.owner,
        attempt = EXCLUDED.attempt,
        token = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                          AND l.expires_at > now()
                     THEN l.token
                     ELSE GREATEST(nextval('dlock_fence_seq'), l.token + 1,
                                   (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) END,
        acquired_at = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                          AND l.expires_at > now()
                     THEN l.acquired_at ELSE now() END,
        expires_at = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                          AND l.expires_at > now()
                     THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
        value = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                          AND l.expires_at > now()
                     THEN l.value ELSE EXCLUDED.value END,
        seq = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                        AND l.expires_at > now()
                   THEN l.seq ELSE 0 END
    WHERE (l.attempt IS NULL OR l.owner IS NULL OR l.expires_at <= now()
           OR l.attempt = EXCLUDED.attempt)
      AND l.ended -> EXCLUDED.attempt IS NULL
    RETURNING l.token
), n AS (
    SELECT pg_notify($7, '') FROM up
)
SELECT (SELECT token FROM up),
       (SELECT (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
        FROM dlock_lease_elections WHERE ns = $1 AND name = $2 AND attempt IS NOT NULL
                                     AND owner IS NOT NULL),
       (SELECT count(*) FROM n)
