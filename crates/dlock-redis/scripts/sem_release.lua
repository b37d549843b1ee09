-- Semaphore: return one acquisition's permits, leave the queue, or change the permit count.
-- One round trip. KEYS as sem_acquire.lua.
-- ARGV[1] owner, ARGV[2] channel, ARGV[3] 'release' | 'giveup' | 'set', ARGV[4] new count (set)
-- release returns {1, 0} returned, {0, 0} not held (its lease had run out); giveup {1, 0} if it
-- gave back permits handed to the owner, else {0, 0}; set {1, 0}.
-- Freed permits are handed straight to the oldest live waiters, in order, while they fit.
local owner = ARGV[1]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

local function hand_over()
  local limit = tonumber(redis.call('get', KEYS[6]))
  if not limit then
    return
  end
  local used = 0
  local fields = redis.call('hgetall', KEYS[1])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) ~= 't:' then
      used = used + tonumber(fields[i + 1])
    end
  end
  while true do
    local head = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not head then
      return
    end
    local data = redis.call('hget', KEYS[4], head)
    local expiry, lease, want
    if data then
      expiry, lease, want = string.match(data, '^(%d+):(%d+):(%d+)')
      expiry, lease, want = tonumber(expiry), tonumber(lease), tonumber(want)
    end
    if expiry and lease and want and expiry > now then
      if used + want > limit then
        return
      end
      local token = redis.call('incr', KEYS[2])
      redis.call('hset', KEYS[1], head, want, 't:' .. head, token)
      redis.call('zadd', KEYS[5], now + lease, head)
      for _, k in ipairs({KEYS[1], KEYS[5]}) do
        if redis.call('pttl', k) < lease then
          redis.call('pexpire', k, lease)
        end
      end
      redis.call('publish', ARGV[2], 'h ' .. token .. ' ' .. head)
      used = used + want
    end
    redis.call('zrem', KEYS[3], head)
    redis.call('hdel', KEYS[4], head)
  end
end

local function drop(m)
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

if ARGV[3] == 'set' then
  redis.call('set', KEYS[6], ARGV[4])
  hand_over()
  return {1, 0}
end

if ARGV[3] == 'giveup' then
  redis.call('zrem', KEYS[3], owner)
  redis.call('hdel', KEYS[4], owner)
  if redis.call('hexists', KEYS[1], owner) == 1 then
    drop(owner)
    hand_over()
    return {1, 0}
  end
  return {0, 0}
end

if redis.call('hexists', KEYS[1], owner) == 0 then
  return {0, 0}
end
drop(owner)
hand_over()
return {1, 0}
