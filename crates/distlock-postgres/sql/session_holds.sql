-- Whether this session holds the key in the mode of the grant's kind.
-- $1 classid, $2 objid, $3 mode.
SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()
                 AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1 AND l.mode = $3
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
