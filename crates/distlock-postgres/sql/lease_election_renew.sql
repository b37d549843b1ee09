-- Renews many leaderships at once, as lease_renew.sql, on the election rows.
-- $1 ns, $2 names, $3 attempts, $4 tokens, $5 leases (ms).
UPDATE dlock_lease_elections l
SET expires_at = GREATEST(l.expires_at, now() + v.ms * interval '1 millisecond')
FROM unnest($2::text[], $3::text[], $4::bigint[], $5::float8[]) AS v(name, attempt, token, ms)
WHERE l.ns = $1 AND l.name = v.name AND l.attempt = v.attempt AND l.token = v.token
  AND l.owner IS NOT NULL AND l.expires_at > now()
RETURNING l.name, l.attempt, l.token
