-- Operator's forced release (`dlock release --force`): removes every grant of one lock family
-- and advances the fencing counter past every token issued, in one atomic step, so that no
-- grant can be made between the removal and the advance with a token a removed holder has.
-- Runs after fence.lua.
-- KEYS[1] the grants (mutex hash {attempt, token, owner}, or rw/sem hash ATTEMPT -> grant)
-- KEYS[2] fencing counter
-- KEYS[3] per-grant expiries zset (rw, sem; for the mutex a name that is never written)
-- KEYS[4] (the mutex only) its waiter data: each queued waiter is also woken ('r') on the
--   wake channel its entry names (field '>ATTEMPT', see acquire.lua)
-- ARGV[1] the channel: waiters are woken ('r') to take the free lock (they stay queued)
-- ARGV[2] '1' when KEYS[3] is the family's expiry zset
-- ARGV[3] (an election only) its observe channel, told that nobody leads ('r')
-- Returns {grant fields (flat HGETALL), PTTL of KEYS[1], expiries (flat, WITHSCORES),
-- server ms, new counter value as a string}.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = redis.call('hgetall', KEYS[1])
local pttl = redis.call('pttl', KEYS[1])
local exps = {}
if ARGV[2] == '1' then
  exps = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
  redis.call('del', KEYS[3])
end
redis.call('del', KEYS[1])
-- The counter moves on as for a grant (fence.lua: above every token issued, also when the
-- counter was rolled back or lost), with no lease of its own to outlive.
local token = string.format('%d', next_token(KEYS[2], t, 0, 1))
redis.call('publish', ARGV[1], 'r')
if KEYS[4] then
  local told = {}
  local entries = redis.call('hgetall', KEYS[4])
  for i = 1, #entries, 2 do
    local wake = entries[i + 1]
    if string.sub(entries[i], 1, 1) == '>' and not told[wake] then
      told[wake] = true
      redis.call('publish', wake, 'r')
    end
  end
end
if ARGV[3] then
  redis.call('publish', ARGV[3], 'r')
end
return {fields, pttl, exps, now, token}
