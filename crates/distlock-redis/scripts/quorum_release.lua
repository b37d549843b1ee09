-- Redlock: delete this node's hold of one grant (and nothing else), leave or keep the wait
-- queue, and wake the first live waiter if the lock is free here afterwards — on its own
-- channel only, so a release wakes one waiter, not all. Idempotent: a repeated call finds no
-- such hold and changes nothing (but may remind the first waiter again).
-- KEYS[1] lock hash, KEYS[2] wait queue (zset ATTEMPT -> SCORE), KEYS[3] waiter expiries,
-- KEYS[4] waiter data (hash '>ATTEMPT' -> the waiter's wake channel, see quorum_acquire.lua)
-- ARGV[1] attempt id; ARGV[2] the grant's token, or '' for whatever this attempt holds (a
--   give-up, the give-back of a failed attempt, or a node that holds the attempt under its own
--   counter because the quorum's token never reached it, once a majority released the grant);
-- ARGV[3] the lock's channel; ARGV[4] mode:
--   'release' a grant's release: the attempt leaves the queue; with no waiter queued here,
--     'r' is published on the lock's channel (for waiters that do not queue);
--   'giveback' the minority grants of a failed attempt: it keeps its place in the queue;
--   'giveup' the attempt stops waiting: it leaves the queue and gives back what it holds.
-- ARGV[5] (an election only) its observe channel, told ('r') when a hold was deleted here.
-- Returns {1, 0} released, {0, 0} no lock here (expired, or never granted here), {3, 0} another
-- attempt holds it, {4, token} this attempt holds it here with another token (nothing changed).
local attempt, mode = ARGV[1], ARGV[4]
local held = redis.call('hmget', KEYS[1], 'attempt', 'token')
if held[1] == attempt and ARGV[2] ~= '' and held[2] ~= ARGV[2] then
  return {4, tonumber(held[2]) or 0}
end
local out = {0, 0}
if held[1] == attempt then
  redis.call('del', KEYS[1])
  out = {1, 0}
  if ARGV[5] then
    redis.call('publish', ARGV[5], 'r')
  end
elseif held[1] or redis.call('exists', KEYS[1]) == 1 then
  out = {3, 0}
end
-- No queue here (the uncontended case): nothing to leave, nobody to wake but the waiters that
-- do not queue.
if redis.call('exists', KEYS[2]) == 0 then
  if out[1] == 1 and mode ~= 'giveback' then
    redis.call('publish', ARGV[3], 'r')
  end
  return out
end
if mode ~= 'giveback' then
  redis.call('zrem', KEYS[2], attempt)
  redis.call('zrem', KEYS[3], attempt)
  redis.call('hdel', KEYS[4], '>' .. attempt)
end
if out[1] == 3 then
  return out
end
-- Free here now: the first live waiter's turn.
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('zrangebyscore', KEYS[3], '-inf', now_ms)
for _, a in ipairs(dead) do
  redis.call('zrem', KEYS[2], a)
  redis.call('zrem', KEYS[3], a)
  redis.call('hdel', KEYS[4], '>' .. a)
end
local head = redis.call('zrange', KEYS[2], 0, 0)[1]
if head then
  if head ~= attempt then
    -- On the wake channel its entry names, addressed to it alone ('h 0 ATTEMPT': token 0 is
    -- no grant, only its turn); an entry of an older client listens on CHANNEL:ATTEMPT.
    local wake = redis.call('hget', KEYS[4], '>' .. head)
    if wake then
      redis.call('publish', wake, 'h 0 ' .. head)
    else
      redis.call('publish', ARGV[3] .. ':' .. head, 'r')
    end
  end
elseif out[1] == 1 and mode ~= 'giveback' then
  redis.call('publish', ARGV[3], 'r')
end
return out
