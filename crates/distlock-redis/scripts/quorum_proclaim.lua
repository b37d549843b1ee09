-- Redlock election: the leader advertises a new value on this node (proclaim.lua per node).
-- One round trip; never touches the lease. The hold must carry the grant's address (attempt
-- and token): a node the quorum's token has not reached yet answers 0 and changes nothing (as
-- a renewal does; the value a majority stored is the one inspect reports).
-- KEYS[1] the election's hold hash {attempt, token, owner, value, seq}
-- ARGV[1] attempt id, ARGV[2] token, ARGV[3] the proclamation's number (the core numbers a
-- leadership's proclamations 1, 2, ...; a grant starts at 0), ARGV[4] the value,
-- ARGV[5] the election's observe channel
-- Returns 1 when the grant holds it here (the value stored if ARGV[3] is above the stored
-- number, so a retry or a late duplicate changes nothing), 0 when it does not.
local held = redis.pcall('hmget', KEYS[1], 'attempt', 'token', 'seq')
if held.err or held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
local seq = tonumber(ARGV[3])
if not seq then
  return redis.error_reply('proclaim: sequence number ' .. ARGV[3] .. ' is not a number')
end
if seq > (tonumber(held[3]) or 0) then
  redis.call('hset', KEYS[1], 'value', ARGV[4], 'seq', ARGV[3])
  redis.call('publish', ARGV[5], 'p')
end
return 1
