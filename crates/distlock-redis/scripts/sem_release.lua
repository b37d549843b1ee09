-- Semaphore: return one grant's permits (attempt and token), take an attempt out of the queue
-- and give back a grant made to it, or change the permit count. One round trip. Runs after
-- expiring.lua.
-- KEYS as sem_acquire.lua.
-- ARGV[1] attempt, ARGV[2] token, ARGV[3] channel, ARGV[4] 'release' | 'giveup' | 'set',
-- ARGV[5] new count (set)
-- release and giveup return as `release` in expiring.lua (a release of an attempt that holds
-- nothing is {0, 0}: its lease had run out); set returns {1, 0}.
-- Freed permits go to the queue by the rule of sem_acquire.lua (oldest live waiter that
-- fits; one past its patience blocks younger ones), each told by attempt ('h TOKEN ATTEMPT').
local PATIENCE = 1000

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
      local token = grant(m, tonumber(ms), n, who)
      redis.call('publish', ARGV[3], 'h ' .. string.format('%d', token) .. ' ' .. m)
      free = free - tonumber(n)
    elseif now - since >= PATIENCE then
      break
    end
  end
  if wake then
    redis.call('publish', ARGV[3], 'r')
  end
end

if ARGV[4] == 'set' then
  redis.call('set', KEYS[6], ARGV[5])
  serve()
  return {1, 0}
end
return release(serve, {0, 0})
