-- The longest remaining lease (ms) among the live holders of a name: rows whose backend holds
-- the advisory key right now. $1 ns, $2 name, $3 classid, $4 objid.
SELECT max(EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000)::float8
FROM dlock_holders h WHERE h.ns = $1 AND h.name = $2 AND EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid
          AND l.classid = $3 AND l.objid = $4 AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
