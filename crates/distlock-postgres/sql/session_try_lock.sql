-- One try for an exclusive grant, setting the session's lease in the same statement: $2 when
-- granted, $3 otherwise. $1 key, $4 GUC.
SELECT t.l, set_config($4, CASE WHEN t.l THEN $2 ELSE $3 END, false)
FROM (SELECT pg_try_advisory_lock($1) AS l) t
