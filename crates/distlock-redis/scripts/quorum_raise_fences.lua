-- Redlock: raise each fencing counter KEYS[i] to at least ARGV[i], never lower one (a forced
-- release: past every token any node saw), each living FENCE_MARGIN_MS from now. Runs after
-- fence.lua. Returns how many counters were raised.
local raised = 0
for i = 1, #KEYS do
  local c = tonumber(redis.call('get', KEYS[i]) or '0')
  local v = tonumber(ARGV[i])
  if c and v and c < v then
    keep_fence(KEYS[i], v, 0)
    raised = raised + 1
  end
end
return raised
