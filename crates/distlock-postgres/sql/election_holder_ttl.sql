-- The remaining lease (ms) of an election's leader, if its backend holds the key right now.
-- $1 ns, $2 name, $3 classid, $4 objid.
SELECT max(EXTRACT(EPOCH FROM (e.expires_at - now())) * 1000)::float8
FROM dlock_elections e WHERE e.ns = $1 AND e.name = $2 AND e.pid IS NOT NULL
  AND EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = e.pid
          AND l.classid = $3 AND l.objid = $4 AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
