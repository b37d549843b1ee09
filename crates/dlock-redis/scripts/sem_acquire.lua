-- Semaphore: take permits, claim permits handed over, or queue. One round trip.
-- KEYS[1] holds: hash OWNER -> permits, "t:OWNER" -> token (every acquisition has its own owner)
-- KEYS[2] fencing counter
-- KEYS[3] wait queue: zset OWNER -> arrival ms
-- KEYS[4] waiter data: hash OWNER -> "expiry_ms:lease_ms:permits"
-- KEYS[5] hold expiries: zset OWNER -> expiry ms (each acquisition its own lease)
-- KEYS[6] permit count of the semaphore (set by its first user, changed only explicitly)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] waiter ttl ms (0: do not queue), ARGV[4] '1' when
-- queued, ARGV[5] permits wanted, ARGV[6] permit count to create the semaphore with
-- Returns {1, token} granted; {0, ttl_ms} not enough free permits (ttl: until the first
-- held permit's lease ends, -1 if none).
-- FIFO: a request is granted only when no older live waiter is queued, so a large request
-- is not starved by a stream of small ones.
local owner, lease, want = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

local limit = tonumber(redis.call('get', KEYS[6]))
if not limit then
  limit = tonumber(ARGV[6])
  redis.call('set', KEYS[6], limit)
end

local function extend()
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < lease then
      redis.call('pexpire', k, lease)
    end
  end
end

if redis.call('hexists', KEYS[1], owner) == 1 then
  -- Handed over while queued: claim it, restarting its lease.
  redis.call('zadd', KEYS[5], now + lease, owner)
  extend()
  redis.call('zrem', KEYS[3], owner)
  redis.call('hdel', KEYS[4], owner)
  return {1, tonumber(redis.call('hget', KEYS[1], 't:' .. owner) or '0')}
end

local used = 0
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 2) ~= 't:' then
    used = used + tonumber(fields[i + 1])
  end
end

local function first_in_line()
  for _, m in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    local data = redis.call('hget', KEYS[4], m)
    local expiry = data and tonumber(string.match(data, '^(%d+):'))
    if expiry and expiry > now then
      return m == owner
    end
  end
  return true
end

if used + want <= limit and first_in_line() then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], owner, want, 't:' .. owner, token)
  redis.call('zadd', KEYS[5], now + lease, owner)
  extend()
  redis.call('zrem', KEYS[3], owner)
  redis.call('hdel', KEYS[4], owner)
  return {1, token}
end

local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('zadd', KEYS[3], 'NX', now, owner)
  redis.call('hset', KEYS[4], owner, (now + ttl) .. ':' .. lease .. ':' .. want)
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < ttl then
      redis.call('pexpire', KEYS[i], ttl)
    end
  end
end
local first = redis.call('zrange', KEYS[5], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, math.max(0, tonumber(first[2]) - now)}
end
return {0, -1}
