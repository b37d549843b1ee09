-- Grant (fresh, or the same grant again for a retry of the attempt that holds it) in one
-- statement; on contention the second column is the holder's remaining lease (from the
-- statement's snapshot) in ms. A retry keeps the token and never shortens the lease.
--
-- A grant over an existing row draws its token in the `SET`, which runs on the locked,
-- latest version of the row: the value `VALUES` drew was taken before this statement waited
-- for that row lock, and a grant and release by another client meanwhile would have taken a
-- later value (tokens would go backwards). `VALUES`' token is only used for a name's first
-- row.
-- An attempt in the row's `ended` is never granted (a late copy of a request of it).
-- $1 ns, $2 name, $3 owner, $4 attempt, $5 lease ms.
WITH up AS (
    INSERT INTO dlock_leases AS l (ns, name, owner, attempt, token, acquired_at, expires_at)
    VALUES ($1, $2, $3, $4, nextval('dlock_fence_seq'), now(),
            now() + $5 * interval '1 millisecond')
    ON CONFLICT (ns, name) DO UPDATE SET
        owner = EXCLUDED.owner,
        attempt = EXCLUDED.attempt,
        token = CASE WHEN l.attempt = EXCLUDED.attempt AND l.owner IS NOT NULL
                          AND l.expires_at > now()
                     THEN l.token ELSE nextval('dlock_fence_seq') END,
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
