-- Renew the owner's lease (watchdog tick or extend). One EVALSHA per hold, pipelined.
-- KEYS[1] lock hash; ARGV[1] owner id, ARGV[2] lease in ms
-- Returns 1 renewed, 0 the owner does not hold the lock.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return 0
