-- Ends the campaign of attempt $3 for good: as lease_end.sql, on the election's row.
-- $1 ns, $2 name, $3 attempt, $4 token, $5 channel, $6 seconds to keep the record, $7 most
-- records kept.
WITH o AS (
    SELECT attempt = $3 AND ($4::bigint IS NULL OR token = $4) AND owner IS NOT NULL
               AND expires_at > now() AS mine,
           attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now() AS live
    FROM dlock_lease_elections WHERE ns = $1 AND name = $2 FOR UPDATE
), up AS (
    INSERT INTO dlock_lease_elections AS l
        (ns, name, owner, attempt, token, acquired_at, expires_at, value, seq, ended)
    VALUES ($1, $2, NULL, NULL, 0, NULL, 'epoch', '', 0,
            jsonb_build_object($3::text, extract(epoch FROM now()) + $6::float8))
    ON CONFLICT (ns, name) DO UPDATE SET
        owner = CASE WHEN l.attempt = $3 AND ($4::bigint IS NULL OR l.token = $4)
                     THEN NULL ELSE l.owner END,
        acquired_at = CASE WHEN l.attempt = $3 AND ($4::bigint IS NULL OR l.token = $4)
                           THEN NULL ELSE l.acquired_at END,
        expires_at = CASE WHEN l.attempt = $3 AND ($4::bigint IS NULL OR l.token = $4)
                          THEN 'epoch' ELSE l.expires_at END,
        attempt = CASE WHEN l.attempt = $3 AND ($4::bigint IS NULL OR l.token = $4)
                       THEN NULL ELSE l.attempt END,
        ended = (SELECT jsonb_object_agg(e.k, e.v::float8) FROM (
                    SELECT k, v FROM jsonb_each_text(COALESCE(l.ended, '{}') || EXCLUDED.ended)
                        AS x(k, v)
                    WHERE v::float8 > extract(epoch FROM now())
                    ORDER BY v::float8 DESC LIMIT $7) e)
    RETURNING 1
), n AS (
    SELECT pg_notify($5, '') WHERE (SELECT mine FROM o) IS DISTINCT FROM false
)
SELECT COALESCE((SELECT mine FROM o), false),
       (SELECT live AND NOT mine FROM o),
       (SELECT count(*) FROM n), (SELECT count(*) FROM up)
