-- Semaphore: take permits for one attempt, or queue the attempt. One round trip. Runs after
-- expiring.lua (the keys' shape, the shared steps).
-- KEYS[1] holds: hash ATTEMPT -> "TOKEN:PERMITS:OWNER"
-- KEYS[2] fencing counter (shared with the name's other kinds; its tokens: fence.lua)
-- KEYS[3] wait queue: zset ATTEMPT -> arrival ms
-- KEYS[4] waiter data: hash ATTEMPT -> "EXPIRY_MS:LEASE_MS:PERMITS:OWNER"
-- KEYS[5] hold expiries: zset ATTEMPT -> expiry ms (each grant its own lease)
-- KEYS[6] permit count of the semaphore (set by its first user, changed only explicitly)
-- KEYS[7] the attempt's end record (see acquire.lua): while it exists, the attempt neither gets
--   permits nor queues
-- ARGV[1] attempt, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] waiter ttl ms (0: do not queue),
-- ARGV[5] permits wanted, ARGV[6] permit count to create the semaphore with, ARGV[7] channel
-- Returns {1, token} granted (also to an attempt that held it already); {0, ttl_ms} not
-- enough free permits (ttl: until the first held grant's lease ends, -1 if none);
-- {-2, limit} more permits wanted than the semaphore has.
-- Fairness (the same in sem_release.lua): permits go to the oldest live waiter that fits. A
-- waiter that does not fit lets younger ones pass for PATIENCE ms after it arrived; after
-- that it blocks every younger request until it is served, so the permits drain to it.
local PATIENCE = 1000
local attempt, owner, lease, want = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])

local limit = tonumber(redis.call('get', KEYS[6]))
if not limit then
  limit = tonumber(ARGV[6])
  redis.call('set', KEYS[6], limit)
end

local cur = redis.call('hget', KEYS[1], attempt)
if cur then
  return again(attempt, cur, lease)
end
if redis.call('exists', KEYS[7]) == 1 then
  return held()
end

if want > limit then
  dequeue(attempt)
  return {-2, limit}
end

local ttl = tonumber(ARGV[4])
if ttl > 0 then
  enqueue(attempt, ttl, lease, want, owner)
end

-- Serve the queue in order (the caller too, if it queued), and find out whether a waiter past
-- its patience blocks younger requests. The whole queue is walked even with no permit free:
-- requests above a lowered permit count must be taken out (and woken) wherever they are.
local used = 0
local fields = redis.call('hgetall', KEYS[1])
for i = 2, #fields, 2 do
  used = used + (tonumber(string.match(fields[i], '^%d+:(%d+):')) or 0)
end
local free, blocked, wake, mine = limit - used, false, false, nil
local q = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  local m, since = q[i], tonumber(q[i + 1])
  local data = redis.call('hget', KEYS[4], m)
  local expiry, ms, n, who
  if data then
    expiry, ms, n, who = string.match(data, '^(%d+):(%d+):(%d+):(.*)$')
  end
  if not (expiry and tonumber(expiry) > now) then
    dequeue(m)
  elseif tonumber(n) > limit then
    -- The permit count was lowered below this request: its next attempt is refused.
    dequeue(m)
    wake = true
  elseif tonumber(n) <= free then
    local token = grant(m, tonumber(ms), tonumber(n), who)
    free = free - tonumber(n)
    if m == attempt then
      mine = token
    else
      redis.call('publish', ARGV[7], 'h ' .. string.format('%d', token) .. ' ' .. m)
    end
  elseif now - since >= PATIENCE then
    blocked = true
    break
  end
end
if wake then
  redis.call('publish', ARGV[7], 'r')
end
if mine then
  return {1, mine}
end
if ttl == 0 and want <= free and not blocked then
  return {1, grant(attempt, lease, want, owner)}
end
return held()
