-- Semaphore: return one grant's permits (attempt and token), take an attempt out of the queue
-- and give back a grant made to it, or change the permit count. One round trip.
-- KEYS as sem_acquire.lua.
-- ARGV[1] attempt, ARGV[2] token, ARGV[3] channel, ARGV[4] 'release' | 'giveup' | 'set',
-- ARGV[5] new count (set)
-- release returns {1, 0} returned, {0, 0} not held (its lease had run out), {3, 0} another
-- grant at that address; giveup {1, 0} if it gave back a grant of the attempt, else {0, 0};
-- set {1, 0}.
-- Freed permits go to the queue by the rule of sem_acquire.lua (oldest live waiter that
-- fits; one past its patience blocks younger ones), each told by attempt ('h TOKEN ATTEMPT').
local PATIENCE = 1000
local attempt = ARGV[1]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

local function dequeue(m)
  redis.call('zrem', KEYS[3], m)
  redis.call('hdel', KEYS[4], m)
end

local function serve()
  local limit = tonumber(redis.call('get', KEYS[6]))
  if not limit then
    return
  end
  local q = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
  if #q == 0 then
    return
  end
  local used = 0
  local fields = redis.call('hgetall', KEYS[1])
  for i = 2, #fields, 2 do
    used = used + (tonumber(string.match(fields[i], '^%d+:(%d+):')) or 0)
  end
  local free, wake = limit - used, false
  -- The whole queue, even with no permit free: requests above a lowered count are taken out.
  for i = 1, #q, 2 do
    local m, since = q[i], tonumber(q[i + 1])
    local data = redis.call('hget', KEYS[4], m)
    local expiry, ms, n, who
    if data then
      expiry, ms, n, who = string.match(data, '^(%d+):(%d+):(%d+):(.*)$')
    end
    if not (expiry and tonumber(expiry) > now) then
      dequeue(m)
      wake = true
    elseif tonumber(n) > limit then
      -- The permit count was lowered below this request: its next attempt is refused.
      dequeue(m)
      wake = true
    elseif tonumber(n) <= free then
      if redis.call('exists', KEYS[2]) == 0 then
        redis.call('set', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
      end
      local token = string.format('%d', redis.call('incr', KEYS[2]))
      ms = tonumber(ms)
      redis.call('hset', KEYS[1], m, token .. ':' .. n .. ':' .. who)
      redis.call('zadd', KEYS[5], now + ms, m)
      for _, k in ipairs({KEYS[1], KEYS[5]}) do
        if redis.call('pttl', k) < ms then
          redis.call('pexpire', k, ms)
        end
      end
      dequeue(m)
      redis.call('publish', ARGV[3], 'h ' .. token .. ' ' .. m)
      free = free - tonumber(n)
    elseif now - since >= PATIENCE then
      break
    end
  end
  if wake then
    redis.call('publish', ARGV[3], 'r')
  end
end

local function drop(m)
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

if ARGV[4] == 'set' then
  redis.call('set', KEYS[6], ARGV[5])
  serve()
  return {1, 0}
end

if ARGV[4] == 'giveup' then
  local queued = redis.call('zrem', KEYS[3], attempt) == 1
  redis.call('hdel', KEYS[4], attempt)
  if redis.call('hexists', KEYS[1], attempt) == 1 then
    drop(attempt)
    serve()
    return {1, 0}
  end
  -- A waiter that blocked younger ones (past its patience) leaves: they may fit now.
  if queued then
    serve()
  end
  return {0, 0}
end

local cur = redis.call('hget', KEYS[1], attempt)
if not cur then
  return {0, 0}
end
if string.match(cur, '^(%d+):') ~= ARGV[2] then
  return {3, 0}
end
drop(attempt)
serve()
return {1, 0}
