-- Renew one grant of a read-write lock or a semaphore: each grant has its own expiry.
-- KEYS[1] holds hash (ATTEMPT -> "TOKEN:..."), KEYS[2] hold expiries zset;
-- ARGV[1] attempt id, ARGV[2] token, ARGV[3] lease ms
-- Returns 1 renewed (the grant's lease runs at least ARGV[3] from now; never shortened),
-- 0 the grant is gone.
local cur = redis.call('hget', KEYS[1], ARGV[1])
if not cur or string.match(cur, '^(%d+):') ~= ARGV[2] then
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
local exp = tonumber(redis.call('zscore', KEYS[2], ARGV[1]))
if not exp or exp <= now then
  return 0
end
if exp < now + lease then
  redis.call('zadd', KEYS[2], now + lease, ARGV[1])
end
for _, k in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('pttl', k) < lease then
    redis.call('pexpire', k, lease)
  end
end
return 1
