-- Redlock: delete this node's hold of one grant (and nothing else), leave or keep the wait
-- queue, and wake the first live waiter if the lock is free here afterwards — on its own
-- channel only, so a release wakes one waiter, not all. Idempotent: a repeated call finds no
-- such hold and changes nothing (but may remind the first waiter again).
-- KEYS[1] lock hash; named after it (see quorum_acquire.lua): KEYS[1] .. ':rlq' the wait queue
--   (zset ATTEMPT -> SCORE), .. ':rlq:ttl' the waiter expiries, .. ':waiters' the waiter data
--   (hash '>ATTEMPT' -> the waiter's wake channel), .. ':released' the lock's channel
-- ARGV[1] attempt id; ARGV[2] the grant's token, or '' for whatever this attempt holds (a
--   give-up, the give-back of a failed attempt, or a node that holds the attempt under its own
--   counter because the quorum's token never reached it, once a majority released the grant);
-- ARGV[3] mode, absent (or 'release') for a grant's release:
--   'release' a grant's release: the attempt leaves the queue; with no waiter queued here,
--     'r' is published on the lock's channel (for waiters that do not queue);
--   'giveback' the minority grants of a failed attempt: it keeps its place in the queue;
--   'giveup' the attempt stops waiting: it leaves the queue and gives back what it holds.
-- ARGV[4] (an election only) its observe channel, told ('r') when a hold was deleted here.
-- Returns one integer (a table reply costs the server more than a call): 1 released, 0 no
-- lock here (expired, or never granted here), 3 another attempt holds it, -1 - TOKEN this
-- attempt holds it here with another token TOKEN (nothing changed).
local attempt, mode = ARGV[1], ARGV[3] or 'release'
local queue = KEYS[1] .. ':rlq'
local held = redis.call('hmget', KEYS[1], 'attempt', 'token')
if held[1] == attempt and ARGV[2] ~= '' and held[2] ~= ARGV[2] then
  return -1 - (tonumber(held[2]) or 0)
end
local out = 0
if held[1] == attempt then
  redis.call('del', KEYS[1])
  out = 1
  if ARGV[4] then
    redis.call('publish', ARGV[4], 'r')
  end
elseif held[1] or redis.call('exists', KEYS[1]) == 1 then
  out = 3
end
-- No queue here (the uncontended case): nothing to leave, nobody to wake but the waiters that
-- do not queue.
if redis.call('exists', queue) == 0 then
  if out == 1 and mode ~= 'giveback' then
    redis.call('publish', KEYS[1] .. ':released', 'r')
  end
  return out
end
local ttl, waiters = queue .. ':ttl', KEYS[1] .. ':waiters'
if mode ~= 'giveback' then
  redis.call('zrem', queue, attempt)
  redis.call('zrem', ttl, attempt)
  redis.call('hdel', waiters, '>' .. attempt)
end
if out == 3 then
  return out
end
-- Free here now: the first live waiter's turn.
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('zrangebyscore', ttl, '-inf', now_ms)
for _, a in ipairs(dead) do
  redis.call('zrem', queue, a)
  redis.call('zrem', ttl, a)
  redis.call('hdel', waiters, '>' .. a)
end
local head = redis.call('zrange', queue, 0, 0)[1]
if head then
  if head ~= attempt then
    -- On the wake channel its entry names, addressed to it alone ('h 0 ATTEMPT': token 0 is
    -- no grant, only its turn); an entry of an older client listens on CHANNEL:ATTEMPT.
    local wake = redis.call('hget', waiters, '>' .. head)
    if wake then
      redis.call('publish', wake, 'h 0 ' .. head)
    else
      redis.call('publish', KEYS[1] .. ':released:' .. head, 'r')
    end
  end
elseif out == 1 and mode ~= 'giveback' then
  redis.call('publish', KEYS[1] .. ':released', 'r')
end
return out
