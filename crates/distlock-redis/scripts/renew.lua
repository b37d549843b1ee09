-- Mutex: renew one grant (watchdog tick or extend). One EVALSHA per grant, pipelined.
-- KEYS[1] lock hash {attempt, token, owner}; ARGV[1] attempt id, ARGV[2] token, ARGV[3] lease ms
-- Returns 1 renewed (the lease runs at least ARGV[3] from now; never shortened), 0 not held.
local held = redis.call('hmget', KEYS[1], 'attempt', 'token')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
local lease = tonumber(ARGV[3])
if redis.call('pttl', KEYS[1]) < lease then
  redis.call('pexpire', KEYS[1], lease)
end
return 1
