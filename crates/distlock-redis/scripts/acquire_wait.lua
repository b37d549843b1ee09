-- acquire.lua's paths past the uncontended grant: a retry, a queue, a fair lock's head, the
-- end record; src/scripts.rs puts fence_next.lua and queue.lua between the two files, so that
-- the uncontended grant makes no closure it does not call.
local lease = tonumber(ARGV[3])
local ttl, fair, seq, wake = string.match(ARGV[4], '^(%d+):(%d):(%d+):(.*)$')
ttl = tonumber(ttl)
local queues = ttl ~= nil and ttl > 0
local waiters = KEYS[1] .. ':waiters'
-- The server clock, read once per script (on first use): the queue's times and the token.
local t
local function clock()
  t = t or redis.call('time')
  return t
end
local function now_ms()
  local c = clock()
  return c[1] * 1000 + math.floor(c[2] / 1000)
end
-- Its waiter data is written with the queue entry and removed with it: no entry, no data.
-- `rank` (the attempt's ZRANK, when the script read it) spares the ZREM of an attempt that is
-- not queued.
local rank
local function dequeue()
  if rank == false then
    return
  end
  if queues and redis.call('zrem', queue, attempt) == 1 then
    redis.call('hdel', waiters, attempt, '>' .. attempt, '#' .. attempt)
  end
end

local held = redis.call('hmget', KEYS[1], 'attempt', 'token', 'q')
if held[1] == attempt then
  -- Rewritten as it is: a write of this connection, so that a WAIT after it also covers a
  -- grant made by another connection (a handoff).
  redis.call('hset', KEYS[1], 'attempt', attempt)
  -- A retry never shortens the lease a confirmed earlier request promised.
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  dequeue()
  return tonumber(held[2])
end

-- The oldest waiter whose liveness deadline has not passed (dropping dead ones), or nil.
local function live_head(now)
  while true do
    local head = redis.call('zrange', queue, 0, 0)[1]
    if not head then
      return nil
    end
    local data = redis.call('hget', waiters, head)
    local expiry = data and tonumber(string.match(data, '^(%d+):'))
    if expiry and expiry > now then
      return head
    end
    redis.call('zrem', queue, head)
    redis.call('hdel', waiters, head, '>' .. head, '#' .. head)
  end
end

-- Held by another grant, or one of the queue and the end record exists (the fast path above
-- took the case of none). A hash without an attempt is foreign: not free.
local function held_reply()
  return -2 - redis.call('pttl', KEYS[1])
end
local free, queued = false, false
if redis.call('exists', KEYS[2]) == 1 then
  -- An ended attempt neither gets the lock nor queues: the next release would hand the lock
  -- to nobody.
  return held_reply()
end
if not held[1] and redis.call('exists', KEYS[1]) == 0 then
  -- Free, with a queue (the fast path found one of the three keys, and it is not the hash or
  -- the end record).
  free, queued = true, true
end
if queued then
  -- A fair lock's free lock goes to its oldest live waiter. A plain mutex's goes to whoever
  -- asks first (the contended mode, see release.lua), but a queued waiter keeps its place: it
  -- does not pass the live waiters queued before it (the release woke the oldest; a heartbeat
  -- of one behind it must not take the lock from under it). Only a newcomer barges.
  local behind = fair == '1'
  if not behind and queues then
    rank = redis.call('zrank', queue, attempt)
    behind = rank and rank > 0
  end
  if behind then
    local head = live_head(now_ms())
    if head and head ~= attempt then
      free = false
    end
  end
end
if free then
  -- The token first: foreign data in the counter fails before any write.
  local token, s = grant_token(fence, clock(), ARGV[3])
  -- Granted with a queue there: the grant may have waiters behind it (q).
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', s, 'owner', ARGV[2], 'q', '1')
  if value then
    redis.call('hset', KEYS[1], 'value', value, 'seq', '0')
  end
  redis.call('pexpire', KEYS[1], lease)
  dequeue()
  if value then
    redis.call('publish', ARGV[6], 'g')
  end
  return token
end
if queues then
  local now = now_ms()
  arrive(queue, attempt, now)
  local data = string.format('%d:%d:', now + ttl, lease)
  if value then
    data = data .. string.format('%d:', #value) .. value
  end
  if wake ~= '' then
    redis.call('hset', waiters, attempt, data .. ARGV[2], '>' .. attempt, wake, '#' .. attempt, seq)
  else
    redis.call('hset', waiters, attempt, data .. ARGV[2])
  end
  for _, key in ipairs({queue, waiters}) do
    if redis.call('pttl', key) < ttl then
      redis.call('pexpire', key, ttl)
    end
  end
  if held[1] and not held[3] then
    -- Queued behind a grant: its release must look at the queue.
    redis.call('hset', KEYS[1], 'q', '1')
  end
end
return held_reply()
