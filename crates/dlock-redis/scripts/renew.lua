-- Renew the owner's lease (watchdog tick or extend). One EVALSHA per hold, pipelined.
-- KEYS[1] lock hash, KEYS[2] handoff marker; ARGV[1] owner id, ARGV[2] lease in ms
-- Returns 1 renewed, 0 the owner does not hold the lock.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  -- The owner renews, so it knows it holds the lock: a handoff to it is claimed.
  if redis.call('get', KEYS[2]) == ARGV[1] then
    redis.call('del', KEYS[2])
  end
  return 1
end
return 0
