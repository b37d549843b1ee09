-- Sessions waiting for the key. $1 classid, $2 objid.
SELECT count(*) FROM pg_locks l
WHERE l.locktype = 'advisory' AND NOT l.granted
  AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
