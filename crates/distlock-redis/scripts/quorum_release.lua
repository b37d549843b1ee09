-- Redlock: delete this node's hold of one grant, and nothing else. Idempotent: a repeated
-- release finds no such hold and changes nothing.
-- KEYS[1] lock hash
-- ARGV[1] attempt id; ARGV[2] the grant's token, or '' for whatever this attempt holds (a
--   give-up, the give-back of a failed attempt, or a node that holds the attempt under its own
--   counter because the quorum's token never reached it, once a majority released the grant);
-- ARGV[3] release channel, or '' to give back quietly (the minority grants of a failed
--   attempt: waiters wait for the majority holder's release, and waking them for a minority
--   grant would start a herd of attempts that fail the same way)
-- Returns {1, 0} released, {0, 0} no lock here (expired, or never granted here), {3, 0} another
-- attempt holds it, {4, token} this attempt holds it here with another token (nothing changed).
if redis.call('hget', KEYS[1], 'attempt') == ARGV[1] then
  local token = redis.call('hget', KEYS[1], 'token') or ''
  if ARGV[2] ~= '' and token ~= ARGV[2] then
    return {4, tonumber(token) or 0}
  end
  redis.call('del', KEYS[1])
  if ARGV[3] ~= '' then
    redis.call('publish', ARGV[3], 'r')
  end
  return {1, 0}
end
if redis.call('exists', KEYS[1]) == 0 then
  return {0, 0}
end
return {3, 0}
