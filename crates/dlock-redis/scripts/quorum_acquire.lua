-- Redlock: one node's vote on an acquisition (dlock-redlock). Like acquire.lua without the
-- wait queue (a per-node queue would hand the lock to different waiters on different nodes),
-- plus what the quorum needs: the node's epoch check, the fencing counter in every reply, and
-- the hold's token kept in the lock hash under the field "\1token" (never an owner id: owner
-- ids have no control characters), so that a re-entry returns the token the quorum handed out.
-- KEYS[1] lock hash {owner -> hold count, "\1token" -> token}, PEXPIRE = lease
-- KEYS[2] fencing counter (never expires)
-- KEYS[3] node epoch (set once the node's counters are known to be complete)
-- ARGV[1] owner id, ARGV[2] lease ms, ARGV[3] the epoch the client knows for this node
-- Returns {-1, 0, 0, 0} the epoch differs: the node lost its data or was re-seeded since the
--   client looked, so its vote must not count (nothing was changed);
-- {1, counter, token, 1} granted afresh (counter incremented; token = counter);
-- {2, counter, token, count} re-entered (count after the increment, token as stored);
-- {0, counter, pttl, 0} another owner holds it.
if redis.call('get', KEYS[3]) ~= ARGV[3] then
  return {-1, 0, 0, 0}
end
local owner = ARGV[1]
local lease = tonumber(ARGV[2])
if redis.call('exists', KEYS[1]) == 0 then
  -- INCR first: if the counter holds foreign data the script fails before writing anything.
  local c = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], owner, 1, '\1token', c)
  redis.call('pexpire', KEYS[1], lease)
  return {1, c, c, 1}
end
local c = tonumber(redis.call('get', KEYS[2]) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. KEYS[2] .. ' does not hold a number')
end
if redis.call('hexists', KEYS[1], owner) == 1 then
  local n = redis.call('hincrby', KEYS[1], owner, 1)
  -- Re-entry never shortens the lease another hold of this owner relies on.
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  local t = tonumber(redis.call('hget', KEYS[1], '\1token') or '0') or 0
  return {2, c, t, n}
end
return {0, c, redis.call('pttl', KEYS[1]), 0}
