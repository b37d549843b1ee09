-- Grant (fresh, or the same grant again for a retry of the attempt that holds it) in one
-- statement; on contention the second column is the holder's remaining lease in ms. A retry
-- keeps the token and never shortens the lease. A new token is drawn in the `SET` (on the
-- locked, latest row: `VALUES`' is for a name's first row only), above the row's last one and
-- at least the server clock in µs. An attempt in `ended` is never granted. See lease.rs.
-- $1 ns, $2 name, $3 owner, $4 attempt, $5 lease ms.
WITH up AS (
    INSERT INTO dlock_leases AS l (ns, name, owner, attempt, token, acquired_at, expires_at)
    VALUES ($1, $2, $3, $4,
            GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
            now(),
            now() + $5 * interval '1 millisecond')
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
                     THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END
    WHERE (l.attempt IS NULL OR l.owner IS NULL OR l.expires_at <= now()
           OR l.attempt = EXCLUDED.attempt)
      AND l.ended -> EXCLUDED.attempt IS NULL
    RETURNING l.token
)
SELECT (SELECT token FROM up),
       (SELECT (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
        FROM dlock_leases WHERE ns = $1 AND name = $2 AND attempt IS NOT NULL
                                AND owner IS NOT NULL)
