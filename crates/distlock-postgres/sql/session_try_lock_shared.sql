-- One try for a shared (read) grant, as session_try_lock.sql. $1 key, $2 lease when granted,
-- $3 otherwise, $4 GUC.
SELECT t.l, set_config($4, CASE WHEN t.l THEN $2 ELSE $3 END, false)
FROM (SELECT pg_try_advisory_lock_shared($1) AS l) t
