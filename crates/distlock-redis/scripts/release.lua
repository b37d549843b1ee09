-- Mutex: release one grant (named by attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip.
-- With waiters, a release either **hands the lock over** to the oldest live waiter (fresh
-- fencing token, the waiter's own lease) and tells that attempt, and only it ('h TOKEN
-- ATTEMPT'), on the wake channel its queue entry names (field '>ATTEMPT' of the waiter data,
-- see acquire.lua; an entry without one: KEYS[1]:released:ATTEMPT) — or, in the plain mutex's
-- contended mode, **frees it and wakes** that waiter alone ('w ATTEMPT'), which then asks like
-- anyone else: whoever asks first gets it (the releaser included), as Go's sync.Mutex does.
-- The lock is handed over (strict FIFO) when the oldest live waiter has waited at least
-- ARGV[3] ms (its arrival is its queue score, on the server clock), so no waiter waits much
-- longer than that before the queue serves it (docs/redis-lock.md, "Contended mode"). A fair
-- lock and an election always hand over (ARGV[3] empty). With nobody queued it publishes
-- nothing.
-- KEYS[1] the lock hash; its counter, queue and waiter data are named after it, as in
-- acquire.lua (read only when the grant has a queue behind it), and so is the lock's channel,
-- KEYS[1] .. ':released'. ARGV[1] attempt id, ARGV[2] token ('' for a give-up: any grant of
-- the attempt goes back, and the attempt leaves the queue), ARGV[3] the wait in ms after which
-- releases hand over ('': always); for an election (see acquire.lua) ARGV[4] its observe
-- channel: the new leader's value comes from its waiter data, and every change of leader
-- (handoff, or none left) is published there ('g' / 'r').
-- A release returns 1 released (or handed over), 0 no lock (expired), 3 another grant holds
-- it; a give-up 1 if it gave back a grant of the attempt, else 0. (An integer: a table reply
-- costs the server more than a call.)
local attempt = ARGV[1]
local observe = ARGV[4]

-- The uncontended release first (this grant, and no q: nobody queued behind it, see
-- acquire.lua; HMGET and DEL), before the functions of the other paths are even made.
local held
local release = ARGV[2] ~= ''
if release then
  held = redis.call('hmget', KEYS[1], 'attempt', 'token', 'q')
  if held[1] == attempt and held[2] == ARGV[2] and not held[3] then
    redis.call('del', KEYS[1])
    if observe then
      redis.call('publish', observe, 'r')
    end
    return 1
  end
end
local fence, queue, waiters = KEYS[1] .. ':fence', KEYS[1] .. ':queue', KEYS[1] .. ':waiters'

-- Nobody takes the lock over: the hash goes.
local function free()
  redis.call('del', KEYS[1])
  if observe then
    redis.call('publish', observe, 'r')
  end
end

-- The hash is deleted when nobody takes it over; a handoff rewrites every field it has
-- (attempt, token, owner, q: there was a queue; an election's value and seq) and its expiry
-- instead.
local function hand_over()
  -- With no queue one EXISTS decides it: no ZRANGE, no TIME.
  if redis.call('exists', queue) == 0 then
    free()
    return
  end
  local t = redis.call('time')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local barge_ms = tonumber(ARGV[3])
  while true do
    -- The oldest entry, with its arrival (ms, server clock).
    local first = redis.call('zrange', queue, 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then
      break
    end
    local entry = redis.call('hmget', waiters, head, '>' .. head)
    local data = entry[1]
    local wake = entry[2] or (KEYS[1] .. ':released:' .. head)
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
      redis.call('zrem', queue, head)
      redis.call('hdel', waiters, head, '>' .. head)
      local token = string.format('%d', next_token(fence, t, lease, 1))
      redis.call('hset', KEYS[1], 'attempt', head, 'token', token, 'owner', owner, 'q', '1')
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
    redis.call('zrem', queue, head)
    redis.call('hdel', waiters, head, '>' .. head)
    redis.call('publish', wake, 'r')
  end
  free()
end

if not release then
  local queued = redis.call('zrem', queue, attempt) == 1
  redis.call('hdel', waiters, attempt, '>' .. attempt)
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
hand_over()
return 1
