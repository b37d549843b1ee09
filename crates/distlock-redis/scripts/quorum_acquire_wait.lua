-- Redlock: the rest of a node's vote (quorum_acquire.lua, whose uncontended grant runs before
-- this and before fence_next.lua: src/quorum/mod.rs), for a vote that found a hold, a queue or
-- an end record here. Keys, arguments and replies: see quorum_acquire.lua.
local ttl, waiters = queue .. ':ttl', KEYS[1] .. ':waiters'
local wttl, score, wake = string.match(ARGV[5] or '', '^(%d+):(%d+):(.*)$')
wttl = tonumber(wttl) or 0

local function horizon()
  if horizon_short and redis.call('pttl', horizon_key) < lease then
    local px = lease + math.floor(lease / 8)
    redis.call('set', horizon_key, string.format('%d', now_ms + px), 'PX', px)
  end
end

local function grant(first)
  -- The token first: if the counter holds foreign data the script fails before writing
  -- anything.
  local c = next_token(fence, t, lease, QUORUM_FLOOR_STEP_US)
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', string.format('%d', c), 'owner',
    ARGV[4])
  if ARGV[6] then
    redis.call('hset', KEYS[1], 'value', ARGV[6], 'seq', '0')
  end
  redis.call('pexpire', KEYS[1], lease)
  horizon()
  if ARGV[6] then
    redis.call('publish', KEYS[1] .. ':observe', 'g')
  end
  return {1, c, c, qleft, first}
end

if redis.call('hget', KEYS[1], 'attempt') == attempt then
  -- A retry (its earlier reply was lost) or a vote of an earlier round of this attempt: the
  -- same hold, its lease made to run at least `lease` from now, never shortened. Its queue
  -- entry stays until the release (a round that fails keeps its place).
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  horizon()
  local stored = redis.call('get', fence)
  local c = math.max(tonumber(stored or '0') or 0,
    clock_floor(t, stored and QUORUM_FLOOR_STEP_US or 1))
  return {2, c, tonumber(redis.call('hget', KEYS[1], 'token') or '0') or 0, qleft, 0}
end

-- An ended attempt (its end record exists) neither holds nor queues: status 0. Dead waiters
-- (no refresh within their ttl) leave the queue. (No queue here and no end record: one
-- EXISTS instead of the scan and the look at its head.)
local n = redis.call('exists', queue, KEYS[2])
local ended = n > 0 and redis.call('exists', KEYS[2]) == 1
local queued = n > (ended and 1 or 0)
-- The lock exists when the first EXISTS counted more than these two.
local free = present == n
if ended then
  local c = tonumber(redis.call('get', fence) or '0') or 0
  return {0, c, redis.call('pttl', KEYS[1]), qleft, 0}
end
if queued then
  local dead = redis.call('zrangebyscore', ttl, '-inf', now_ms)
  for _, a in ipairs(dead) do
    redis.call('zrem', queue, a)
    redis.call('zrem', ttl, a)
    redis.call('hdel', waiters, '>' .. a)
  end
end
local head = queued and redis.call('zrange', queue, 0, 0)[1] or nil

if free and (not head or head == attempt) then
  return grant(head == attempt and 1 or 0)
end
if wttl > 0 then
  -- Enqueued (or refreshed) at its place, which is the same on every node and never changes;
  -- the entry names the wake channel its turn is told on.
  redis.call('zadd', queue, 'NX', score, attempt)
  if wake ~= '' then
    redis.call('hset', waiters, '>' .. attempt, wake)
  end
  redis.call('zadd', ttl, now_ms + wttl, attempt)
  for _, k in ipairs({queue, ttl, waiters}) do
    if redis.call('pttl', k) < wttl then
      redis.call('pexpire', k, wttl)
    end
  end
  head = redis.call('zrange', queue, 0, 0)[1]
end
local first = (head == attempt) and 1 or 0

if free then
  if first == 1 then
    -- Its place is ahead of the waiter that was first.
    return grant(1)
  end
  -- Free, but it is the first waiter's turn: remind it (its wake-up may have been lost).
  local w = redis.call('hget', waiters, '>' .. head)
  if w then
    redis.call('publish', w, 'h 0 ' .. head)
  else
    redis.call('publish', KEYS[1] .. ':released:' .. head, 'r')
  end
  local c = tonumber(redis.call('get', fence) or '0') or 0
  return {3, c, 0, qleft, 0}
end
local c = tonumber(redis.call('get', fence) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. fence .. ' does not hold a number')
end
return {0, c, redis.call('pttl', KEYS[1]), qleft, first}
