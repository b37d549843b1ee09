-- The live holders of a name (rows whose backend holds the advisory key right now), of the
-- kinds $5: owner, count, lease left (ms), kind. $1 ns, $2 name, $3 classid, $4 objid.
SELECT h.owner, 1::int4,
       GREATEST(EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000, 0)::float8,
       h.kind
FROM dlock_holders h
WHERE h.ns = $1 AND h.name = $2 AND h.kind = ANY($5) AND EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid
          AND l.classid = $3 AND l.objid = $4 AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
ORDER BY h.acquired_at, h.owner, h.attempt
