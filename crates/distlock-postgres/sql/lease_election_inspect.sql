-- The election row: owner, leading, token, lease left (ms), value. $1 ns, $2 name.
SELECT owner, attempt IS NOT NULL AND owner IS NOT NULL, token,
       (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8, value
FROM dlock_lease_elections WHERE ns = $1 AND name = $2
