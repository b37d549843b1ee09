-- Redlock: after a grant by a majority, raise this node's fencing counter to the token the
-- quorum chose (never lower it), record the token in the lock hash, and optionally set the
-- owner's hold count (to repair a count left behind by an earlier failed attempt). Only where
-- the owner still holds the lock, so a node that lost the lock does not confirm the token.
-- KEYS[1] lock hash, KEYS[2] fencing counter
-- ARGV[1] owner id, ARGV[2] token, ARGV[3] hold count to set (0: leave it)
-- Returns {1, counter} done (counter >= token now), {0, counter} the owner does not hold it.
local c = tonumber(redis.call('get', KEYS[2]) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. KEYS[2] .. ' does not hold a number')
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return {0, c}
end
local t = tonumber(ARGV[2])
if c < t then
  redis.call('set', KEYS[2], ARGV[2])
  c = t
end
redis.call('hset', KEYS[1], '\1token', ARGV[2])
if tonumber(ARGV[3]) > 0 then
  redis.call('hset', KEYS[1], ARGV[1], ARGV[3])
end
return {1, c}
