-- Redlock: take back one hold of a failed quorum attempt, quietly. Unlike release.lua it
-- publishes nothing: waiters wait for the majority holder's release, and waking all of them
-- for a minority grant would start a herd of attempts that fail the same way.
-- KEYS[1] lock hash; ARGV[1] owner id
-- Returns 1 if a hold of the owner was taken back, 0 if the owner held nothing here.
local n = redis.call('hget', KEYS[1], ARGV[1])
if not n then
  return 0
end
n = (tonumber(n) or 1) - 1
if n > 0 then
  redis.call('hset', KEYS[1], ARGV[1], n)
else
  redis.call('del', KEYS[1])
end
return 1
