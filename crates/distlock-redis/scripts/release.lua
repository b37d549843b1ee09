-- Mutex: release one grant (named by attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip.
-- With waiters, a release either **hands the lock over** to the oldest live waiter (fresh
-- fencing token, the waiter's own lease) and tells that attempt, and only it ('h TOKEN
-- ATTEMPT'), on the wake channel its queue entry names (field '>ATTEMPT' of KEYS[4], see
-- acquire.lua; an entry without one: CHANNEL:ATTEMPT) — or, in the plain mutex's contended
-- mode, **frees it and wakes** that waiter alone ('w ATTEMPT'), which then asks like anyone
-- else: whoever asks first gets it (the releaser included), as Go's sync.Mutex does. The
-- lock is handed over (strict FIFO) when the oldest live waiter has waited at least ARGV[5]
-- ms (its arrival is its queue score, on the server clock), so no waiter waits much longer
-- than that before the queue serves it (docs/redis-lock.md, "Contended mode"). A fair lock
-- and an election always hand over (ARGV[5] empty). With nobody queued it publishes nothing.
-- KEYS as acquire.lua; ARGV[1] attempt id, ARGV[2] token, ARGV[3] the lock's channel,
-- ARGV[4] 'release' or 'giveup', ARGV[5] the wait in ms after which releases hand over ('':
-- always); for an election (see acquire.lua) ARGV[6] its observe channel: the new leader's
-- value comes from its waiter data, and every change of leader (handoff, or none left) is
-- published there ('g' / 'r').
-- release returns 1 released (or handed over), 0 no lock (expired), 3 another grant holds it.
-- giveup returns 1 if it gave back a grant of the attempt, else 0. (An integer: a table reply
-- costs the server more than a call.)
local attempt = ARGV[1]
local observe = ARGV[6]

-- The uncontended release first (this grant, and no queue: HMGET, EXISTS, DEL), before the
-- functions of the other paths are even made.
local held, queue
if ARGV[4] == 'release' then
  held = redis.call('hmget', KEYS[1], 'attempt', 'token')
  if held[1] == attempt and held[2] == ARGV[2] then
    queue = redis.call('exists', KEYS[3]) == 1
    if not queue then
      redis.call('del', KEYS[1])
      if observe then
        redis.call('publish', observe, 'r')
      end
      return 1
    end
  end
end

-- Nobody takes the lock over: the hash goes.
local function free()
  redis.call('del', KEYS[1])
  if observe then
    redis.call('publish', observe, 'r')
  end
end

-- The hash is deleted when nobody takes it over; a handoff rewrites every field it has
-- (attempt, token, owner; an election's value and seq) and its expiry instead.
local function hand_over(queue_there)
  -- With no queue one EXISTS decides it: no ZRANGE, no TIME.
  if not queue_there and redis.call('exists', KEYS[3]) == 0 then
    free()
    return
  end
  local t = redis.call('time')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local barge_ms = tonumber(ARGV[5])
  while true do
    -- The oldest entry, with its arrival (ms, server clock).
    local first = redis.call('zrange', KEYS[3], 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then
      break
    end
    local entry = redis.call('hmget', KEYS[4], head, '>' .. head)
    local data = entry[1]
    local wake = entry[2] or (ARGV[3] .. ':' .. head)
    local expiry, lease, owner, value
    if data then
      expiry, lease, owner = string.match(data, '^(%d+):(%d+):(.*)$')
    end
    if observe and owner then
      -- An election's waiter data: LEN:VALUE then OWNER.
      local len, rest = string.match(owner, '^(%d+):(.*)$')
      len = tonumber(len)
      if len and #rest >= len then
        value, owner = string.sub(rest, 1, len), string.sub(rest, len + 1)
      else
        expiry = nil
      end
    end
    if expiry and tonumber(expiry) > now then
      if barge_ms and now - tonumber(first[2]) < barge_ms then
        -- Contended mode: the oldest waiter has not waited long. Free the lock and wake it
        -- (it stays queued, in its place): the first to ask gets the lock.
        free()
        redis.call('publish', wake, 'w ' .. head)
        return
      end
      redis.call('zrem', KEYS[3], head)
      redis.call('hdel', KEYS[4], head, '>' .. head)
      local token = string.format('%d', next_token(KEYS[2], t, lease, 1))
      redis.call('hset', KEYS[1], 'attempt', head, 'token', token, 'owner', owner)
      if observe then
        redis.call('hset', KEYS[1], 'value', value, 'seq', '0')
      end
      redis.call('pexpire', KEYS[1], lease)
      redis.call('publish', wake, 'h ' .. token .. ' ' .. head)
      if observe then
        redis.call('publish', observe, 'g')
      end
      return
    end
    -- A dead entry: its waiter may still be watching (one late heartbeat); wake it to retry.
    redis.call('zrem', KEYS[3], head)
    redis.call('hdel', KEYS[4], head, '>' .. head)
    redis.call('publish', wake, 'r')
  end
  free()
end

if ARGV[4] == 'giveup' then
  local queued = redis.call('zrem', KEYS[3], attempt) == 1
  redis.call('hdel', KEYS[4], attempt, '>' .. attempt)
  if redis.call('hget', KEYS[1], 'attempt') == attempt then
    hand_over()
    return 1
  end
  -- A free lock (its holder expired, or a release of the contended mode woke this leaver)
  -- with waiters behind the leaver: the next one gets it, or is woken to ask.
  if queued and redis.call('exists', KEYS[1]) == 0 then
    hand_over()
  end
  return 0
end

if held[1] ~= attempt or held[2] ~= ARGV[2] then
  if redis.call('exists', KEYS[1]) == 0 then
    return 0
  end
  return 3
end
hand_over(queue)
return 1
