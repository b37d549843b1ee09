-- Release one hold of the owner (only the owner can), or take a waiter out of the queue.
-- One round trip. A full release hands the lock straight to the oldest live waiter (fresh
-- fencing token, the waiter's own lease) and tells it on the channel, so it needs no round
-- trip of its own; with no live waiter it publishes a plain release.
-- KEYS as acquire.lua; ARGV[1] owner id, ARGV[2] channel, ARGV[3] 'release' or 'giveup'
-- release returns {1, 0} freed (or handed over), {2, n} n holds remain, {0, 0} no lock
-- (expired), {3, 0} another owner holds it. giveup returns {1, 0} if it gave back a lock
-- handed to the owner, else {0, 0}.
local owner = ARGV[1]

local function hand_over()
  redis.call('del', KEYS[1])
  redis.call('del', KEYS[5])
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local head = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not head then
      break
    end
    redis.call('zrem', KEYS[3], head)
    local data = redis.call('hget', KEYS[4], head)
    redis.call('hdel', KEYS[4], head)
    if data then
      local sep = string.find(data, ':', 1, true)
      local expiry = sep and tonumber(string.sub(data, 1, sep - 1))
      local lease = sep and tonumber(string.sub(data, sep + 1))
      if expiry and lease and expiry > now then
        local token = redis.call('incr', KEYS[2])
        redis.call('hset', KEYS[1], head, 1)
        redis.call('pexpire', KEYS[1], lease)
        redis.call('set', KEYS[5], head, 'PX', lease)
        redis.call('publish', ARGV[2], 'h ' .. token .. ' ' .. head)
        return
      end
    end
  end
  redis.call('publish', ARGV[2], 'r')
end

if ARGV[3] == 'giveup' then
  redis.call('zrem', KEYS[3], owner)
  redis.call('hdel', KEYS[4], owner)
  if redis.call('get', KEYS[5]) == owner and redis.call('hexists', KEYS[1], owner) == 1 then
    hand_over()
    return {1, 0}
  end
  return {0, 0}
end

if redis.call('exists', KEYS[1]) == 0 then
  return {0, 0}
end
local count = redis.call('hget', KEYS[1], owner)
if not count then
  return {3, 0}
end
count = tonumber(count) - 1
if count > 0 then
  redis.call('hset', KEYS[1], owner, count)
  return {2, count}
end
hand_over()
return {1, 0}
