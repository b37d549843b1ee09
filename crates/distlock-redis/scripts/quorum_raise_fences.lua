-- Redlock: seed fencing counters of a node that lost them: raise each counter KEYS[i] to at
-- least ARGV[i] (the largest value a majority of the other nodes has), never lower one.
-- Returns how many counters were raised.
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
