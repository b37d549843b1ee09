-- release.lua's paths past the uncontended release: a handoff, a wake-up, a give-up;
-- src/scripts.rs puts the fencing prelude (fence.lua, fence_next.lua) between the two files,
-- so that the uncontended release makes no closure.
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
    local entry = redis.call('hmget', waiters, head, '>' .. head, '#' .. head)
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
      redis.call('hdel', waiters, head, '>' .. head, '#' .. head)
      local token = string.format('%d', next_token(fence, t, lease, 1))
      redis.call('hset', KEYS[1], 'attempt', head, 'token', token, 'owner', owner, 'q', '1')
      if observe then
        redis.call('hset', KEYS[1], 'value', value, 'seq', '0')
      end
      redis.call('pexpire', KEYS[1], lease)
      if entry[3] then
        redis.call('publish', wake, 'h ' .. token .. ' ' .. head .. ' ' .. entry[3])
      else
        redis.call('publish', wake, 'h ' .. token .. ' ' .. head)
      end
      if observe then
        redis.call('publish', observe, 'g')
      end
      return
    end
    -- A dead entry: its waiter may still be watching (one late heartbeat); wake it to retry.
    redis.call('zrem', queue, head)
    redis.call('hdel', waiters, head, '>' .. head, '#' .. head)
    redis.call('publish', wake, 'r')
  end
  free()
end

if not release then
  local queued = redis.call('zrem', queue, attempt) == 1
  redis.call('hdel', waiters, attempt, '>' .. attempt, '#' .. attempt)
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
