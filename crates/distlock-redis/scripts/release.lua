-- Mutex: release one grant (named by attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip. A release hands the lock straight to the
-- oldest live waiter (fresh fencing token, the waiter's own lease) and tells that attempt, and
-- only it ('h TOKEN ATTEMPT'), on the wake channel its queue entry names (field '>ATTEMPT' of
-- KEYS[4], see acquire.lua; an entry without one: CHANNEL:ATTEMPT): one delivery per handoff,
-- however many clients wait. With nobody queued it publishes nothing.
-- KEYS as acquire.lua; ARGV[1] attempt id, ARGV[2] token, ARGV[3] the lock's channel,
-- ARGV[4] 'release' or 'giveup'; for an election (see acquire.lua) ARGV[5] its observe
-- channel: the new leader's value comes from its waiter data, and every change of leader
-- (handoff, or none left) is published there ('g' / 'r').
-- release returns {1, 0} released (or handed over), {0, 0} no lock (expired), {3, 0} another
-- grant holds it. giveup returns {1, 0} if it gave back a grant of the attempt, else {0, 0}.
local attempt = ARGV[1]
local observe = ARGV[5]

-- The hash is deleted when nobody takes it over; a handoff rewrites every field it has
-- (attempt, token, owner; an election's value and seq) and its expiry instead.
local function hand_over()
  -- ZPOPMIN: the oldest entry, taken out of the queue (with its data below) in one call.
  local popped = redis.call('zpopmin', KEYS[3])
  if not popped[1] then
    redis.call('del', KEYS[1])
    if observe then
      redis.call('publish', observe, 'r')
    end
    return
  end
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while popped[1] do
    local head = popped[1]
    local entry = redis.call('hmget', KEYS[4], head, '>' .. head)
    local data = entry[1]
    local wake = entry[2] or (ARGV[3] .. ':' .. head)
    redis.call('hdel', KEYS[4], head, '>' .. head)
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
    redis.call('publish', wake, 'r')
    popped = redis.call('zpopmin', KEYS[3])
  end
  redis.call('del', KEYS[1])
  if observe then
    redis.call('publish', observe, 'r')
  end
end

if ARGV[4] == 'giveup' then
  local queued = redis.call('zrem', KEYS[3], attempt) == 1
  redis.call('hdel', KEYS[4], attempt, '>' .. attempt)
  if redis.call('hget', KEYS[1], 'attempt') == attempt then
    hand_over()
    return {1, 0}
  end
  -- A free lock (its holder expired) with waiters behind the leaver: the next one gets it.
  if queued and redis.call('exists', KEYS[1]) == 0 then
    hand_over()
  end
  return {0, 0}
end

local held = redis.call('hmget', KEYS[1], 'attempt', 'token')
if held[1] ~= attempt or held[2] ~= ARGV[2] then
  if redis.call('exists', KEYS[1]) == 0 then
    return {0, 0}
  end
  return {3, 0}
end
hand_over()
return {1, 0}
