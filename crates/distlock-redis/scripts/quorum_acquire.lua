-- Redlock: one node's vote on an acquisition attempt (distlock-redlock), and the node's part of
-- the wait queue. The hold is addressed by the attempt id, which is unique forever: a retry of
-- the same attempt finds its own hold and gets it back (never a second hold), and any other
-- attempt, even of the same owner, is another holder (re-entry is counted in the client).
-- The queue only decides who may be granted here (its first live waiter); the grant itself is
-- still decided by the majority in the client, so a queue that differs between nodes can cost
-- a round, never a second holder. Waiters carry their place (SCORE, the same on every node),
-- so every node orders the waiters it has the same way.
-- KEYS[1] lock hash {attempt, token, owner}, PEXPIRE = lease
-- KEYS[2] fencing counter (fence.lua: a fresh grant's token is max(counter + 1, TIME in µs
--   rounded down to QUORUM_FLOOR_STEP_US, set in front of this script by src/quorum/mod.rs);
--   it expires FENCE_MARGIN_MS after the end of the last lease granted; never lowered)
-- KEYS[3] node epoch "RANDOM:UNTIL_MS:RUN_ID" (exists while the node has not lost its data
--   since it was initialised; UNTIL_MS is the end of its restart quarantine, by its clock)
-- KEYS[4] lease horizon: PX >= the longest lease granted or renewed here that may still run
-- KEYS[5] wait queue: zset ATTEMPT -> SCORE (the waiter's place)
-- KEYS[6] waiter expiries: zset ATTEMPT -> expiry ms (server clock)
-- KEYS[7] the attempt's end record NS:{NAME}:ended:ATTEMPT, written by its give-up or release
--   on this node when a vote of it may still be on its way: while it exists, a vote of the
--   attempt is a late one of an attempt that ended, and neither holds nor queues here
--   (answered as status 0)
-- KEYS[8] waiter data: hash '>ATTEMPT' -> the wake channel of the waiter's client (where its
--   turn is told, 'h 0 ATTEMPT'; the single-server layout, so a forced release wakes them too)
-- ARGV[1] attempt id, ARGV[2] lease ms, ARGV[3] the epoch the client knows, ARGV[4] owner id,
-- ARGV[5] waiter ttl ms ('0': do not queue), ARGV[6] SCORE, ARGV[7] the lock's channel (a
--   waiter without a wake channel, of an older client, listens on CHANNEL:ATTEMPT),
-- ARGV[8] the waiter's wake channel ('' if none), ARGV[9], ARGV[10] (an election only) its
--   value and its observe channel
-- Returns {-1, 0, 0, 0, 0} the epoch differs: the node lost its data or was initialised again
--   since the client looked, so its vote must not count (nothing was changed); otherwise
--   {status, counter, x, quarantine_left_ms, first}:
--   status 1 granted afresh (the counter moved on, fence.lua; x = token stored = counter),
--   status 2 this attempt already holds it here (x = the token stored with the hold; the
--     lease now runs at least ARGV[2] from now, never shortened; counter = the stored one
--     floored by the clock as for a grant: a fresh token the client derives from it,
--     counter + 1, stays above every earlier one, fence.lua),
--   status 0 another attempt holds it (x = its pttl),
--   status 3 free here, but another waiter is first in this node's queue (x = 0);
--   first = 1 when this attempt is the first live waiter here.
-- A waiter is queued only where it has to wait: a free lock with nobody ahead is granted
-- without touching the queue (the uncontended vote of a waiter is a try's).
local epoch = redis.call('get', KEYS[3])
if epoch ~= ARGV[3] then
  return {-1, 0, 0, 0, 0}
end
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(string.match(epoch, '^[^:]*:(%d+):')) or 0
local qleft = math.max(0, until_ms - now_ms)
local attempt = ARGV[1]
local lease = tonumber(ARGV[2])
local wttl = tonumber(ARGV[5])

-- Whoever loses this node's data later must stay out of majorities until every lease it may
-- have held has run out: the horizon remembers how long that is (read when initialising it).
-- It is set an eighth longer than the lease, so that the votes of the next eighth of a lease
-- find it long enough and leave it alone (a quarantine that long is only ever longer than
-- needed, never shorter).
local function horizon()
  if redis.call('pttl', KEYS[4]) < lease then
    redis.call('set', KEYS[4], ARGV[2], 'PX', lease + math.floor(lease / 8))
  end
end

local function grant(first)
  -- The token first: if the counter holds foreign data the script fails before writing
  -- anything.
  local c = next_token(KEYS[2], t, lease, QUORUM_FLOOR_STEP_US)
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', string.format('%d', c), 'owner',
    ARGV[4])
  if ARGV[9] then
    redis.call('hset', KEYS[1], 'value', ARGV[9], 'seq', '0')
  end
  redis.call('pexpire', KEYS[1], lease)
  horizon()
  if ARGV[10] then
    redis.call('publish', ARGV[10], 'g')
  end
  return {1, c, c, qleft, first}
end

-- One EXISTS for the lock, the queue and the end record: none of them (the uncontended case)
-- means free, with nobody queued and no end record: granted at once.
local present = redis.call('exists', KEYS[1], KEYS[5], KEYS[7])
if present == 0 then
  return grant(0)
end

if redis.call('hget', KEYS[1], 'attempt') == attempt then
  -- A retry (its earlier reply was lost) or a vote of an earlier round of this attempt: the
  -- same hold, its lease made to run at least `lease` from now, never shortened. Its queue
  -- entry stays until the release (a round that fails keeps its place).
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  horizon()
  local stored = redis.call('get', KEYS[2])
  local c = math.max(tonumber(stored or '0') or 0,
    clock_floor(t, stored and QUORUM_FLOOR_STEP_US or 1))
  return {2, c, tonumber(redis.call('hget', KEYS[1], 'token') or '0') or 0, qleft, 0}
end

-- An ended attempt (its end record exists) neither holds nor queues: status 0. Dead waiters
-- (no refresh within their ttl) leave the queue. (No queue here and no end record: one
-- EXISTS instead of the scan and the look at its head.)
local n = redis.call('exists', KEYS[5], KEYS[7])
local ended = n > 0 and redis.call('exists', KEYS[7]) == 1
local queue = n > (ended and 1 or 0)
-- The lock exists when the first EXISTS counted more than these two.
local free = present == n
if ended then
  local c = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  return {0, c, redis.call('pttl', KEYS[1]), qleft, 0}
end
if queue then
  local dead = redis.call('zrangebyscore', KEYS[6], '-inf', now_ms)
  for _, a in ipairs(dead) do
    redis.call('zrem', KEYS[5], a)
    redis.call('zrem', KEYS[6], a)
    redis.call('hdel', KEYS[8], '>' .. a)
  end
end
local head = queue and redis.call('zrange', KEYS[5], 0, 0)[1] or nil


if free and (not head or head == attempt) then
  return grant(head == attempt and 1 or 0)
end
if wttl > 0 then
  -- Enqueued (or refreshed) at its place, which is the same on every node and never changes;
  -- the entry names the wake channel its turn is told on.
  redis.call('zadd', KEYS[5], 'NX', ARGV[6], attempt)
  if ARGV[8] ~= '' then
    redis.call('hset', KEYS[8], '>' .. attempt, ARGV[8])
  end
  redis.call('zadd', KEYS[6], now_ms + wttl, attempt)
  for _, k in ipairs({KEYS[5], KEYS[6], KEYS[8]}) do
    if redis.call('pttl', k) < wttl then
      redis.call('pexpire', k, wttl)
    end
  end
  head = redis.call('zrange', KEYS[5], 0, 0)[1]
end
local first = (head == attempt) and 1 or 0

if free then
  if first == 1 then
    -- Its place is ahead of the waiter that was first.
    return grant(1)
  end
  -- Free, but it is the first waiter's turn: remind it (its wake-up may have been lost).
  local wake = redis.call('hget', KEYS[8], '>' .. head)
  if wake then
    redis.call('publish', wake, 'h 0 ' .. head)
  else
    redis.call('publish', ARGV[7] .. ':' .. head, 'r')
  end
  local c = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  return {3, c, 0, qleft, 0}
end
local c = tonumber(redis.call('get', KEYS[2]) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. KEYS[2] .. ' does not hold a number')
end
return {0, c, redis.call('pttl', KEYS[1]), qleft, first}
