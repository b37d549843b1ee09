-- Acquire, re-enter, or claim a handed-over lock; queue the caller if it will wait.
-- One round trip.
-- KEYS[1] lock hash {owner -> hold count}, PEXPIRE = lease (Redisson's layout)
-- KEYS[2] fencing counter (never expires, so tokens keep increasing)
-- KEYS[3] wait queue: zset owner -> arrival time (ms, server clock)
-- KEYS[4] waiter data: hash owner -> "expiry_ms:lease_ms"
-- KEYS[5] handoff marker: the owner the lock was last handed to, until it shows it knows
-- ARGV[1] owner id, ARGV[2] lease ms, ARGV[3] waiter ttl ms (0: do not queue),
-- ARGV[4] '1' when the caller is already queued (an attempt after the first of a wait)
-- ARGV[5] '1' for a fair lock: a free lock goes to the oldest live waiter, not to a newcomer
-- Returns {1, token} when granted, re-entered or claimed; {0, pttl} when another owner holds it.
local owner = ARGV[1]
local lease = tonumber(ARGV[2])
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The oldest waiter whose liveness deadline has not passed (dropping dead ones), or nil.
local function live_head(now)
  while true do
    local head = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not head then
      return nil
    end
    local data = redis.call('hget', KEYS[4], head)
    local expiry = data and tonumber(string.match(data, '^(%d+):'))
    if expiry and expiry > now then
      return head
    end
    redis.call('zrem', KEYS[3], head)
    redis.call('hdel', KEYS[4], head)
  end
end

local free = redis.call('exists', KEYS[1]) == 0
if free and ARGV[5] == '1' then
  local head = live_head(now_ms())
  if head and head ~= owner then
    free = false
  end
end
if free then
  -- INCR first: if the counter holds foreign data the script fails before writing anything.
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], lease)
  if ARGV[4] == '1' then
    redis.call('zrem', KEYS[3], owner)
    redis.call('hdel', KEYS[4], owner)
  end
  return {1, token}
end
if redis.call('hexists', KEYS[1], owner) == 1 then
  if ARGV[4] == '1' then
    -- A queued waiter already in the hash was handed the lock and missed the message:
    -- claim it (one hold, not a re-entry) and restart the lease from now.
    redis.call('pexpire', KEYS[1], lease)
  else
    redis.call('hincrby', KEYS[1], owner, 1)
    -- Re-entry never shortens the lease another hold of this owner relies on.
    if redis.call('pttl', KEYS[1]) < lease then
      redis.call('pexpire', KEYS[1], lease)
    end
  end
  if redis.call('get', KEYS[5]) == owner then
    redis.call('del', KEYS[5])
  end
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  local now = now_ms()
  redis.call('zadd', KEYS[3], 'NX', now, owner)
  redis.call('hset', KEYS[4], owner, (now + ttl) .. ':' .. lease)
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < ttl then
      redis.call('pexpire', KEYS[i], ttl)
    end
  end
end
return {0, redis.call('pttl', KEYS[1])}
