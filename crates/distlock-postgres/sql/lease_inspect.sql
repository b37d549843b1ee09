-- The lease row of a name: owner, granted, token, lease left (ms). $1 ns, $2 name.
SELECT owner, attempt IS NOT NULL AND owner IS NOT NULL, token, (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
FROM dlock_leases WHERE ns = $1 AND name = $2
