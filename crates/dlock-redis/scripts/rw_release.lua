-- Read-write lock: release one hold, or take a waiter out of the queue. One round trip.
-- KEYS as rw_acquire.lua; ARGV[1] owner, ARGV[2] channel, ARGV[3] 'release' or 'giveup',
-- ARGV[4] 'r' or 'w'
-- release returns {1, 0} released, {2, n} n holds remain, {0, 0} not held (expired),
-- {3, 0} not held and the lock is held by others; giveup returns {1, 0} if it gave back a
-- hold handed to the owner, else {0, 0}.
-- When the last writer leaves, or the last reader, the oldest live waiters are let in:
-- a writer alone, or every reader up to the first queued writer.
local owner, side = ARGV[1], ARGV[4]
local me = side .. ':' .. owner
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

local function state()
  local writer, readers = false, 0
  local fields = redis.call('hgetall', KEYS[1])
  for i = 1, #fields, 2 do
    local p = string.sub(fields[i], 1, 2)
    if p == 'w:' then
      writer = true
    elseif p == 'r:' then
      readers = readers + 1
    end
  end
  return writer, readers
end

local function grant(m, lease)
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], m, 1, 't:' .. m, token)
  redis.call('zadd', KEYS[5], now + lease, m)
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < lease then
      redis.call('pexpire', k, lease)
    end
  end
  redis.call('publish', ARGV[2], 'h ' .. token .. ' ' .. string.sub(m, 3))
end

local function hand_over()
  local writer, readers = state()
  if writer then
    return
  end
  local granted = 0
  while true do
    local head = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not head then
      break
    end
    local data = redis.call('hget', KEYS[4], head)
    local expiry, lease
    if data then
      expiry, lease = string.match(data, '^(%d+):(%d+)')
      expiry, lease = tonumber(expiry), tonumber(lease)
    end
    if not (expiry and lease and expiry > now) then
      redis.call('zrem', KEYS[3], head)
      redis.call('hdel', KEYS[4], head)
    elseif string.sub(head, 1, 2) == 'w:' then
      if readers == 0 and granted == 0 then
        redis.call('zrem', KEYS[3], head)
        redis.call('hdel', KEYS[4], head)
        grant(head, lease)
        granted = granted + 1
      else
        -- The writer waits for the remaining readers; waking anyone would be in vain.
        return
      end
      break
    else
      redis.call('zrem', KEYS[3], head)
      redis.call('hdel', KEYS[4], head)
      grant(head, lease)
      granted = granted + 1
    end
  end
  if granted == 0 then
    redis.call('publish', ARGV[2], 'r')
  end
end

local function drop(m)
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

if ARGV[3] == 'giveup' then
  redis.call('zrem', KEYS[3], me)
  redis.call('hdel', KEYS[4], me)
  if redis.call('hexists', KEYS[1], me) == 1 then
    drop(me)
    hand_over()
    return {1, 0}
  end
  return {0, 0}
end

local count = redis.call('hget', KEYS[1], me)
if not count then
  if redis.call('hlen', KEYS[1]) == 0 then
    return {0, 0}
  end
  return {3, 0}
end
count = tonumber(count) - 1
if count > 0 then
  redis.call('hset', KEYS[1], me, count)
  return {2, count}
end
drop(me)
hand_over()
return {1, 0}
