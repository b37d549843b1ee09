-- Redlock: after a majority voted for an attempt, raise this node's fencing counter to the
-- token the quorum chose (never lower it) and record the token with the attempt's hold. Only
-- where that attempt still holds the lock, so a node that lost it does not confirm the token.
-- Runs after fence.lua. KEYS[1] lock hash, KEYS[2] fencing counter
-- ARGV[1] attempt id, ARGV[2] token; for an election ARGV[3] its observe channel, told ('g')
--   when the hold's token changed (observers read the leader's token again)
-- Returns {1, counter} done (counter >= token now), {0, counter} the attempt does not hold it.
local c = tonumber(redis.call('get', KEYS[2]) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. KEYS[2] .. ' does not hold a number')
end
if redis.call('hget', KEYS[1], 'attempt') ~= ARGV[1] then
  return {0, c}
end
local t = tonumber(ARGV[2])
if c < t then
  -- With the expiry of a counter granted from now: the margin past the hold's lease.
  keep_fence(KEYS[2], t, math.max(0, redis.call('pttl', KEYS[1])))
  c = t
end
if ARGV[3] and redis.call('hget', KEYS[1], 'token') ~= ARGV[2] then
  redis.call('hset', KEYS[1], 'token', ARGV[2])
  redis.call('publish', ARGV[3], 'g')
  return {1, c}
end
redis.call('hset', KEYS[1], 'token', ARGV[2])
return {1, c}
