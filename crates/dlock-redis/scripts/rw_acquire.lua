-- Read-write lock: acquire, re-enter, downgrade, or claim a handed-over hold; queue waiters.
-- One round trip.
-- KEYS[1] holds: hash "r:OWNER"/"w:OWNER" -> hold count, "t:r:OWNER"/"t:w:OWNER" -> token
-- KEYS[2] fencing counter (shared with the name's other kinds)
-- KEYS[3] wait queue: zset "r:OWNER"/"w:OWNER" -> arrival ms
-- KEYS[4] waiter data: hash "r:OWNER"/"w:OWNER" -> "expiry_ms:lease_ms"
-- KEYS[5] hold expiries: zset "r:OWNER"/"w:OWNER" -> expiry ms (each hold its own lease)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] waiter ttl ms (0: do not queue),
-- ARGV[4] '1' when queued, ARGV[5] 'r' or 'w'
-- Returns {1, token} granted; {0, ttl_ms} held (-1: unknown); {-1, 0} a read holder asked
-- for the write side (an upgrade would deadlock).
-- Policy: a writer waits for all readers; a new reader does not pass a queued writer, so a
-- stream of readers cannot starve writers; queued readers behind no writer are let in together.
local owner, lease, side = ARGV[1], tonumber(ARGV[2]), ARGV[5]
local me = side .. ':' .. owner
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Drop holds whose own lease ran out.
for _, m in ipairs(redis.call('zrangebyscore', KEYS[5], '-inf', now)) do
  redis.call('hdel', KEYS[1], m, 't:' .. m)
  redis.call('zrem', KEYS[5], m)
end

local writer, readers = nil, 0
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
  local f = fields[i]
  if string.sub(f, 1, 2) == 'w:' then
    writer = string.sub(f, 3)
  elseif string.sub(f, 1, 2) == 'r:' then
    readers = readers + 1
  end
end

local function extend(m)
  local exp = now + lease
  local cur = tonumber(redis.call('zscore', KEYS[5], m))
  if not cur or cur < exp then
    redis.call('zadd', KEYS[5], exp, m)
  end
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < lease then
      redis.call('pexpire', k, lease)
    end
  end
end

local function dequeue()
  redis.call('zrem', KEYS[3], me)
  redis.call('hdel', KEYS[4], me)
end

-- Re-entry, or a queued waiter claiming a hold handed to it.
if redis.call('hexists', KEYS[1], me) == 1 then
  if ARGV[4] ~= '1' then
    redis.call('hincrby', KEYS[1], me, 1)
  end
  extend(me)
  dequeue()
  return {1, tonumber(redis.call('hget', KEYS[1], 't:' .. me) or '0')}
end

-- Is a live writer queued before us (or at all, for a caller not yet queued)?
local function writer_queued_ahead()
  local my_score = tonumber(redis.call('zscore', KEYS[3], me))
  local q = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local m, score = q[i], tonumber(q[i + 1])
    if my_score and (score > my_score or (score == my_score and m >= me)) then
      return false
    end
    if string.sub(m, 1, 2) == 'w:' and m ~= me then
      local data = redis.call('hget', KEYS[4], m)
      local expiry = data and tonumber(string.match(data, '^(%d+):'))
      if expiry and expiry > now then
        return true
      end
    end
  end
  return false
end

-- Is the caller the oldest live waiter (or is nobody waiting)?
local function first_in_line()
  local q = redis.call('zrange', KEYS[3], 0, -1)
  for _, m in ipairs(q) do
    local data = redis.call('hget', KEYS[4], m)
    local expiry = data and tonumber(string.match(data, '^(%d+):'))
    if expiry and expiry > now then
      return m == me
    end
  end
  return true
end

local grant = false
if side == 'w' then
  if redis.call('hexists', KEYS[1], 'r:' .. owner) == 1 then
    return {-1, 0}
  end
  grant = writer == nil and readers == 0 and first_in_line()
else
  if writer == owner then
    grant = true -- downgrade: the writer may also read
  else
    grant = writer == nil and not writer_queued_ahead()
  end
end

if grant then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], me, 1, 't:' .. me, token)
  extend(me)
  dequeue()
  return {1, token}
end

local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('zadd', KEYS[3], 'NX', now, me)
  redis.call('hset', KEYS[4], me, (now + ttl) .. ':' .. lease)
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < ttl then
      redis.call('pexpire', KEYS[i], ttl)
    end
  end
end
-- Sleep at most until the first hold we wait for would expire.
local first = redis.call('zrange', KEYS[5], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, math.max(0, tonumber(first[2]) - now)}
end
return {0, -1}
