-- Read-write lock: release one grant (attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip.
-- KEYS as rw_acquire.lua; ARGV[1] attempt, ARGV[2] token, ARGV[3] channel,
-- ARGV[4] 'release' or 'giveup'
-- release returns {1, 0} released, {0, 0} not held (expired), {3, 0} not held and the lock
-- is held by other grants; giveup returns {1, 0} if it gave back a grant of the attempt,
-- else {0, 0}.
-- When the last writer leaves, or the last reader, the oldest live waiters are let in:
-- a writer alone, or every reader up to the first queued writer; each is told on the
-- channel, by attempt ('h TOKEN ATTEMPT').
local attempt = ARGV[1]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

local function grant(m, lease, side, owner)
  if redis.call('exists', KEYS[2]) == 0 then
    redis.call('set', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local token = string.format('%d', redis.call('incr', KEYS[2]))
  redis.call('hset', KEYS[1], m, token .. ':' .. side .. ':' .. owner)
  redis.call('zadd', KEYS[5], now + lease, m)
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < lease then
      redis.call('pexpire', k, lease)
    end
  end
  redis.call('publish', ARGV[3], 'h ' .. token .. ' ' .. m)
end

local function hand_over()
  local readers = 0
  local fields = redis.call('hgetall', KEYS[1])
  for i = 2, #fields, 2 do
    local s = string.match(fields[i], '^%d+:(%a):')
    if s == 'w' then
      return
    elseif s == 'r' then
      readers = readers + 1
    end
  end
  local q = redis.call('zrange', KEYS[3], 0, -1)
  if #q == 0 then
    return
  end
  local granted = 0
  for _, m in ipairs(q) do
    local data = redis.call('hget', KEYS[4], m)
    local expiry, lease, side, owner
    if data then
      expiry, lease, side, owner = string.match(data, '^(%d+):(%d+):(%a):(.*)$')
    end
    if not (expiry and tonumber(expiry) > now) then
      redis.call('zrem', KEYS[3], m)
      redis.call('hdel', KEYS[4], m)
    elseif side == 'w' then
      if readers == 0 and granted == 0 then
        redis.call('zrem', KEYS[3], m)
        redis.call('hdel', KEYS[4], m)
        grant(m, tonumber(lease), 'w', owner)
        granted = 1
      elseif granted == 0 then
        -- The writer waits for the remaining readers; waking anyone would be in vain.
        return
      end
      break
    else
      redis.call('zrem', KEYS[3], m)
      redis.call('hdel', KEYS[4], m)
      grant(m, tonumber(lease), 'r', owner)
      granted = granted + 1
    end
  end
  if granted == 0 then
    redis.call('publish', ARGV[3], 'r')
  end
end

local function drop(m)
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

if ARGV[4] == 'giveup' then
  local queued = redis.call('zrem', KEYS[3], attempt) == 1
  redis.call('hdel', KEYS[4], attempt)
  if redis.call('hexists', KEYS[1], attempt) == 1 then
    drop(attempt)
    hand_over()
    return {1, 0}
  end
  -- A queued writer that leaves may let the readers queued behind it in.
  if queued then
    hand_over()
  end
  return {0, 0}
end

local cur = redis.call('hget', KEYS[1], attempt)
if not cur then
  if redis.call('hlen', KEYS[1]) == 0 then
    return {0, 0}
  end
  return {3, 0}
end
if string.match(cur, '^(%d+):') ~= ARGV[2] then
  return {3, 0}
end
drop(attempt)
hand_over()
return {1, 0}
