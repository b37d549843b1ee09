-- Release one hold of the owner; only the owner can. One round trip.
-- KEYS[1] lock hash; ARGV[1] owner id, ARGV[2] release channel
-- Returns {1, 0} freed (and PUBLISHed), {2, n} n holds remain, {0, 0} no lock (expired),
-- {3, 0} another owner holds it.
if redis.call('exists', KEYS[1]) == 0 then
  return {0, 0}
end
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
  return {3, 0}
end
count = tonumber(count) - 1
if count > 0 then
  redis.call('hset', KEYS[1], ARGV[1], count)
  return {2, count}
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], '1')
return {1, 0}
