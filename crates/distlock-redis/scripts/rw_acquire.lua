-- Read-write lock: acquire one side for one attempt, or queue the attempt. One round trip.
-- Runs after expiring.lua (the keys' shape, the shared steps).
-- KEYS[1] holds: hash ATTEMPT -> "TOKEN:SIDE:OWNER" (SIDE 'r' or 'w')
-- KEYS[2] fencing counter (shared with the name's other kinds; its tokens: fence.lua)
-- KEYS[3] wait queue: zset ATTEMPT -> arrival ms
-- KEYS[4] waiter data: hash ATTEMPT -> "EXPIRY_MS:LEASE_MS:SIDE:OWNER"
-- KEYS[5] hold expiries: zset ATTEMPT -> expiry ms (each grant its own lease)
-- KEYS[6] the attempt's end record (see acquire.lua): while it exists, the attempt neither gets
--   the lock nor queues
-- ARGV[1] attempt, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] waiter ttl ms (0: do not queue),
-- ARGV[5] 'r' or 'w', ARGV[6] attempt of the caller's live write grant ('' if none; read side
-- only: a downgrade), ARGV[7] that grant's token
-- Returns {1, token} granted (also to an attempt that held it already); {0, ttl_ms} held
-- (-1: unknown); {-1, 0} the owner holds the read side and asks for the write side (an
-- upgrade would deadlock with other readers doing the same; owner ids are compared here, the
-- one place they are).
-- Policy: a writer waits for all readers; a new reader does not pass a queued writer, so a
-- stream of readers cannot starve writers; queued readers behind no writer are let in together.
local attempt, owner, lease, side = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5]

local cur = redis.call('hget', KEYS[1], attempt)
if cur then
  return again(attempt, cur, lease)
end
if redis.call('exists', KEYS[6]) == 1 then
  return held()
end

local writer, readers, my_read = false, 0, false
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
  local s, o = string.match(fields[i + 1], '^%d+:(%a):(.*)$')
  if s == 'w' then
    writer = true
  elseif s == 'r' then
    readers = readers + 1
    if o == owner then
      my_read = true
    end
  end
end

local function live(m)
  local data = redis.call('hget', KEYS[4], m)
  local expiry, s
  if data then
    expiry, s = string.match(data, '^(%d+):%d+:(%a):')
  end
  return expiry and tonumber(expiry) > now, s
end

-- Is a live writer queued before the caller (or at all, for a caller not yet queued)?
local function writer_queued_ahead()
  local my_score = tonumber(redis.call('zscore', KEYS[3], attempt))
  local q = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local m, score = q[i], tonumber(q[i + 1])
    if my_score and (score > my_score or (score == my_score and m >= attempt)) then
      return false
    end
    local alive, s = live(m)
    if alive and s == 'w' then
      return true
    end
  end
  return false
end

-- Is the caller the oldest live waiter (or is nobody waiting)?
local function first_in_line()
  for _, m in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    if live(m) then
      return m == attempt
    end
  end
  return true
end

local ok = false
if side == 'w' then
  -- Refused when asked, not when the owner's read grant arrived while this attempt already
  -- waited (another task of the handle): that one waits for the read to be released.
  if my_read and not redis.call('zscore', KEYS[3], attempt) then
    return {-1, 0}
  end
  ok = not writer and readers == 0 and first_in_line()
else
  local w = ARGV[6] ~= '' and redis.call('hget', KEYS[1], ARGV[6])
  if w and string.match(w, '^(%d+):w:') == ARGV[7] then
    ok = true -- downgrade: the caller's own write grant, named by the request
  else
    ok = not writer and not writer_queued_ahead()
  end
end

if ok then
  return {1, grant(attempt, lease, side, owner)}
end

local ttl = tonumber(ARGV[4])
if ttl > 0 then
  enqueue(attempt, ttl, lease, side, owner)
end
-- Sleep at most until the first grant we wait for would expire.
return held()
