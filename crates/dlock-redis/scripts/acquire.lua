-- Acquire (or re-enter) the reentrant mutex. One round trip.
-- KEYS[1] lock hash {owner -> hold count}, with the lease as its PEXPIRE
-- KEYS[2] fencing counter (never expires, so tokens keep increasing)
-- ARGV[1] owner id, ARGV[2] lease in ms
-- Returns {1, token} when granted or re-entered, {0, pttl} when another owner holds it.
if redis.call('exists', KEYS[1]) == 0 then
  -- INCR first: if the counter holds foreign data the script fails before writing anything.
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, token}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  -- Re-entry never shortens the lease another hold of this owner relies on.
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('pexpire', KEYS[1], ARGV[2])
  end
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}
