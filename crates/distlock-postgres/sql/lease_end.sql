-- Ends attempt $3 for good, for an attempt that had a request without an answer (a copy of it
-- may still reach the server): frees the row if that attempt holds it (with token $4; any
-- token of the attempt when $4 is NULL, for a give-up), and records the attempt in the row's
-- `ended` ({attempt: until, in epoch seconds}), until $6 seconds from now, so that a late copy
-- of its acquire never grants it (lease_acquire.sql checks it on the locked row). Records
-- past their time are dropped, and at most the $7 latest kept. A missing row is made (free,
-- token 0). Waiters are woken (at commit) when the row was freed. The first column tells
-- whether it was freed, the second whether another grant holds it (both from the row read
-- under its lock, before the change). $1 ns, $2 name, $3 attempt, $4 token, $5 channel,
-- $6 seconds to keep the record, $7 most records kept.
WITH o AS (
    SELECT attempt = $3 AND ($4::bigint IS NULL OR token = $4) AND owner IS NOT NULL
               AND expires_at > now() AS mine,
           attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now() AS live
    FROM dlock_leases WHERE ns = $1 AND name = $2 FOR UPDATE
), up AS (
    INSERT INTO dlock_leases AS l (ns, name, owner, attempt, token, acquired_at, expires_at, ended)
    VALUES ($1, $2, NULL, NULL, 0, NULL, 'epoch',
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
