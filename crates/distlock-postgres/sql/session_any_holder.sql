-- Whether anybody holds the key. $1 classid, $2 objid.
SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted
                 AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
