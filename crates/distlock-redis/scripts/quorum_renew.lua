-- Redlock: renew one grant's hold on this node (attempt and token must both match) so that
-- its lease runs at least ARGV[3] ms from now; never shortens it (a short extend, or a renewal
-- that arrives after a longer one, changes nothing).
-- KEYS[1] lock hash, KEYS[2] lease horizon
-- ARGV[1] attempt id, ARGV[2] token, ARGV[3] lease ms
-- Returns 1 renewed, 0 this attempt does not hold it here, {2, token} this attempt holds it
-- here with another token (nothing changed).
if redis.call('hget', KEYS[1], 'attempt') ~= ARGV[1] then
  return 0
end
local token = redis.call('hget', KEYS[1], 'token')
if token ~= ARGV[2] then
  return {2, tonumber(token) or 0}
end
local lease = tonumber(ARGV[3])
if redis.call('pttl', KEYS[1]) < lease then
  redis.call('pexpire', KEYS[1], lease)
end
if redis.call('pttl', KEYS[2]) < lease then
  redis.call('set', KEYS[2], ARGV[3], 'PX', lease)
end
return 1
