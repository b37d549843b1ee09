-- Renew one hold of a read-write lock or a semaphore: each hold has its own expiry.
-- KEYS[1] holds hash, KEYS[2] hold expiries zset; ARGV[1] member, ARGV[2] lease ms
-- Returns 1 renewed, 0 the hold is gone.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local cur = tonumber(redis.call('zscore', KEYS[2], ARGV[1]))
if not cur or cur <= now then
  return 0
end
redis.call('zadd', KEYS[2], now + lease, ARGV[1])
for _, k in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('pttl', k) < lease then
    redis.call('pexpire', k, lease)
  end
end
return 1
