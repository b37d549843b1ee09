-- Prelude of the read-write lock and semaphore scripts (rw_*.lua, sem_*.lua): put in front of
-- each one when it is built (src/scripts.rs, after fence.lua), so that they share one copy of
-- what they do alike.
-- KEYS[1] holds: hash ATTEMPT -> "TOKEN:X:OWNER" (X: the side 'r'/'w', or the permits)
-- KEYS[2] fencing counter (shared with the name's other kinds; its tokens: fence.lua)
-- KEYS[3] wait queue: zset ATTEMPT -> arrival ms
-- KEYS[4] waiter data: hash ATTEMPT -> "EXPIRY_MS:LEASE_MS:X:OWNER"
-- KEYS[5] hold expiries: zset ATTEMPT -> expiry ms (each grant its own lease)
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Drop grants whose own lease ran out.
for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

-- Makes the holds and their expiries live at least ms from now (never shorter).
local function keep(ms)
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < ms then
      redis.call('pexpire', k, ms)
    end
  end
end

local function dequeue(m)
  redis.call('zrem', KEYS[3], m)
  redis.call('hdel', KEYS[4], m)
end

local function drop(m)
  redis.call('hdel', KEYS[1], m)
  redis.call('zrem', KEYS[5], m)
end

-- A fresh grant to attempt m with its own lease ms: the next fencing token, stored as
-- "TOKEN:X:WHO"; m leaves the queue. Returns the token.
local function grant(m, ms, x, who)
  local token = next_token(KEYS[2], t, ms, 1)
  redis.call('hset', KEYS[1], m, string.format('%d:', token) .. x .. ':' .. who)
  redis.call('zadd', KEYS[5], now + ms, m)
  keep(ms)
  dequeue(m)
  return token
end

-- Attempt m asks again for the grant `cur` it holds (a retry, or a handoff not heard of): the
-- same grant, rewritten as it is so that a WAIT covers it, its lease made to run at least ms
-- from now (never shortened); m leaves the queue. Returns {1, token}.
local function again(m, cur, ms)
  redis.call('hset', KEYS[1], m, cur)
  local exp = tonumber(redis.call('zscore', KEYS[5], m))
  if not exp or exp < now + ms then
    redis.call('zadd', KEYS[5], now + ms, m)
  end
  keep(ms)
  dequeue(m)
  return {1, tonumber(string.match(cur, '^(%d+):'))}
end

-- Queues attempt m (kept if queued already) as a waiter alive for ttl ms that asks for a
-- lease of ms, for X, as owner who.
local function enqueue(m, ttl, ms, x, who)
  arrive(KEYS[3], m, now)
  redis.call('hset', KEYS[4], m, string.format('%d:%d:', now + ttl, ms) .. x .. ':' .. who)
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < ttl then
      redis.call('pexpire', KEYS[i], ttl)
    end
  end
end

-- "Held": {0, ms until the first grant's lease ends}, or {0, -1} with no grant.
local function held()
  local first = redis.call('zrange', KEYS[5], 0, 0, 'WITHSCORES')
  if first[2] then
    return {0, math.max(0, tonumber(first[2]) - now)}
  end
  return {0, -1}
end

-- The release side, ARGV[1] attempt, ARGV[2] token, ARGV[4] 'release' or 'giveup'; serve()
-- lets waiters in after a change. release returns {1, 0} released, {0, 0} not held (expired),
-- {3, 0} another grant at that address, or `busy` when the attempt holds nothing while
-- others hold grants; giveup (the attempt leaves the queue) {1, 0} if it gave back a grant of
-- the attempt, else {0, 0}.
local function release(serve, busy)
  local attempt = ARGV[1]
  if ARGV[4] == 'giveup' then
    local queued = redis.call('zrem', KEYS[3], attempt) == 1
    redis.call('hdel', KEYS[4], attempt)
    if redis.call('hexists', KEYS[1], attempt) == 1 then
      drop(attempt)
      serve()
      return {1, 0}
    end
    -- A waiter that leaves may let the ones queued behind it in.
    if queued then
      serve()
    end
    return {0, 0}
  end
  local cur = redis.call('hget', KEYS[1], attempt)
  if not cur then
    if redis.call('hlen', KEYS[1]) == 0 then
      return {0, 0}
    end
    return busy
  end
  if string.match(cur, '^(%d+):') ~= ARGV[2] then
    return {3, 0}
  end
  drop(attempt)
  serve()
  return {1, 0}
end

