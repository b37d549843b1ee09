-- Read-write lock: release one grant (attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip. Runs after expiring.lua.
-- KEYS as rw_acquire.lua; ARGV[1] attempt, ARGV[2] token, ARGV[3] channel,
-- ARGV[4] 'release' or 'giveup'
-- Returns as `release` in expiring.lua; a release of an attempt that holds nothing while
-- other grants hold the lock is {3, 0}.
-- When the last writer leaves, or the last reader, the oldest live waiters are let in:
-- a writer alone, or every reader up to the first queued writer; each is told on the
-- channel, by attempt ('h TOKEN ATTEMPT').

local function let_in(m, lease, side, owner)
  local token = grant(m, lease, side, owner)
  redis.call('publish', ARGV[3], 'h ' .. string.format('%d', token) .. ' ' .. m)
end

local function hand_over()
  local readers = 0
  local fields = redis.call('hgetall', KEYS[1])
  for i = 2, #fields, 2 do
    local s = string.match(fields[i], '^%d+:(%a):')
    if s == 'w' then
      return
    elseif s == 'r' then
      readers = readers + 1
    end
  end
  local q = redis.call('zrange', KEYS[3], 0, -1)
  if #q == 0 then
    return
  end
  local granted = 0
  for _, m in ipairs(q) do
    local data = redis.call('hget', KEYS[4], m)
    local expiry, lease, side, owner
    if data then
      expiry, lease, side, owner = string.match(data, '^(%d+):(%d+):(%a):(.*)$')
    end
    if not (expiry and tonumber(expiry) > now) then
      dequeue(m)
    elseif side == 'w' then
      if readers == 0 and granted == 0 then
        let_in(m, tonumber(lease), 'w', owner)
        granted = 1
      elseif granted == 0 then
        -- The writer waits for the remaining readers; waking anyone would be in vain.
        return
      end
      break
    else
      let_in(m, tonumber(lease), 'r', owner)
      granted = granted + 1
    end
  end
  if granted == 0 then
    redis.call('publish', ARGV[3], 'r')
  end
end

return release(hand_over, {3, 0})
