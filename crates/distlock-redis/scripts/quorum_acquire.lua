-- Redlock: one node's vote on an acquisition attempt (distlock-redlock), and the node's part of
-- the wait queue. The hold is addressed by the attempt id, which is unique forever: a retry of
-- the same attempt finds its own hold and gets it back (never a second hold), and any other
-- attempt, even of the same owner, is another holder (re-entry is counted in the client).
-- The queue only decides who may be granted here (its first live waiter); the grant itself is
-- still decided by the majority in the client, so a queue that differs between nodes can cost
-- a round, never a second holder. Waiters carry their place (SCORE, the same on every node),
-- so every node orders the waiters it has the same way.
-- Lean on purpose, as the single server's acquire.lua (docs/redis-lock.md, "Costs": each KEYS
-- or ARGV element ~1,400 instructions, each redis.call ~6,000-8,000, a table reply more than a
-- call): three keys and four arguments for a try, the keys only the other paths touch named
-- after KEYS[1] (same hash tag), the waiter's arguments in one, and this file is the
-- uncontended vote alone: src/quorum/mod.rs puts the rest of the fencing prelude and the other
-- paths (quorum_acquire_wait.lua) after it.
-- KEYS[1] lock hash {attempt, token, owner}, PEXPIRE = lease
-- KEYS[2] the attempt's end record NS:{NAME}:ended:ATTEMPT, written by its give-up or release
--   on this node when a vote of it may still be on its way: while it exists, a vote of the
--   attempt is a late one of an attempt that ended, and neither holds nor queues here
--   (answered as status 0)
-- KEYS[3] node epoch NS:redlock:epoch, "RANDOM:UNTIL_MS:RUN_ID" (exists while the node has not
--   lost its data since it was initialised; UNTIL_MS is the end of its restart quarantine, by
--   its clock)
-- Named after KEYS[1] (a Redlock node is a plain master, never a Cluster: the epoch is in
-- another slot anyway):
-- KEYS[1] .. ':fence' fencing counter (fence.lua: a fresh grant's token is max(counter + 1,
--   TIME in µs rounded down to QUORUM_FLOOR_STEP_US, set in front of this script by
--   src/quorum/mod.rs); it expires FENCE_MARGIN_MS after the end of the last lease granted;
--   never lowered)
-- KEYS[1] .. ':rlq' wait queue: zset ATTEMPT -> SCORE (the waiter's place)
-- KEYS[1] .. ':rlq:ttl' waiter expiries: zset ATTEMPT -> expiry ms (server clock)
-- KEYS[1] .. ':waiters' waiter data: hash '>ATTEMPT' -> the wake channel of the waiter's client
--   (where its turn is told, 'h 0 ATTEMPT'; the single-server layout, so a forced release
--   wakes them too)
-- KEYS[1] .. ':released' the lock's channel (a waiter without a wake channel, of an older
--   client, listens on CHANNEL:ATTEMPT); KEYS[1] .. ':observe' an election's observe channel
-- KEYS[3] with 'horizon' for 'epoch' (NS:redlock:horizon): the lease horizon, PX >= the
--   longest lease granted or renewed here that may still run, never shortened; the value a
--   vote or a renewal writes is the node's time in ms when it expires (read with the epoch in
--   one MGET: a value that says "long enough" spares the PTTL; an older client's value, its
--   lease, says nothing)
-- ARGV[1] attempt id, ARGV[2] lease ms, ARGV[3] the epoch the client knows, ARGV[4] owner id,
-- ARGV[5] (a waiter's vote) 'TTL:SCORE:WAKE': the waiter ttl ms, its place and its wake
--   channel ('' if none); absent or '' for a try (do not queue); ARGV[6] (an election only)
--   its value.
-- Returns -1 when the epoch differs: the node lost its data or was initialised again since
--   the client looked, so its vote must not count (nothing was changed). The uncontended
--   grant with no quarantine left (the common answer) returns the counter alone, an integer
--   > 0 (= status 1, x = counter, quarantine 0, first 0). Otherwise
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
local horizon_key = string.sub(KEYS[3], 1, -6) .. 'horizon'
local node = redis.call('mget', KEYS[3], horizon_key)
local epoch = node[1]
if epoch ~= ARGV[3] then
  return -1
end
local t = redis.call('time')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local qleft = (tonumber(string.match(epoch, '^[^:]*:(%d+):')) or 0) - now_ms
if qleft < 0 then
  qleft = 0
end
local attempt = ARGV[1]
local lease = tonumber(ARGV[2])
local fence, queue = KEYS[1] .. ':fence', KEYS[1] .. ':rlq'

-- Whoever loses this node's data later must stay out of majorities until every lease it may
-- have held has run out: the horizon remembers how long that is (read when initialising it).
-- A vote that holds sets it an eighth longer than its lease, so that the votes of the next
-- eighth of a lease find it long enough and leave it alone (a quarantine that long is only ever
-- longer than needed, never shorter), and never shortens it. The value a vote (or a renewal)
-- writes is the node's time when it expires, never later than it does (TIME is read before
-- the SET; a margin of 2 ms for the rounding): one that says "long enough" spares the check
-- any call of its own (it came with the epoch's MGET). Any other value (an older client's: its
-- lease) says nothing, and its PTTL decides, as it always did.
local horizon_at = tonumber(node[2])
local horizon_short = not horizon_at or horizon_at - 2 < now_ms + lease

-- The uncontended case first: no hold, no queue, no end record (one EXISTS of the three):
-- free, with nobody queued and no end record: granted at once (the token: GET and SET of the
-- counter, fence.lua; the hold: HSET and PEXPIRE).
local present = redis.call('exists', KEYS[1], queue, KEYS[2])
if present == 0 then
  local c = fence_token(fence, t, QUORUM_FLOOR_STEP_US)
  local s = string.format('%d', c)
  redis.call('set', fence, s, 'PX', lease + FENCE_MARGIN_MS)
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', s, 'owner', ARGV[4])
  if ARGV[6] then
    redis.call('hset', KEYS[1], 'value', ARGV[6], 'seq', '0')
  end
  redis.call('pexpire', KEYS[1], lease)
  if horizon_short and redis.call('pttl', horizon_key) < lease then
    local px = lease + math.floor(lease / 8)
    redis.call('set', horizon_key, string.format('%d', now_ms + px), 'PX', px)
  end
  if ARGV[6] then
    redis.call('publish', KEYS[1] .. ':observe', 'g')
  end
  if qleft > 0 then
    return {1, c, c, qleft, 0}
  end
  return c
end
