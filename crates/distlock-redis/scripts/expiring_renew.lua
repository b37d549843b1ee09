-- Renew one grant of a read-write lock or a semaphore: each grant has its own expiry. A
-- function of renew_many.lua, which puts it in front of its loop at compile time.
-- holds: hash (ATTEMPT -> "TOKEN:..."), exps: hold expiries zset; attempt id, token (strings),
-- lease ms (number), now: the server's TIME in ms (read once per script).
-- Returns 1 renewed (the grant's lease runs at least `lease` from now; never shortened),
-- 0 the grant is gone.
local function renew_expiring(holds, exps, attempt, token, lease, now)
  local cur = redis.call('hget', holds, attempt)
  if not cur or string.match(cur, '^(%d+):') ~= token then
    return 0
  end
  local exp = tonumber(redis.call('zscore', exps, attempt))
  if not exp or exp <= now then
    return 0
  end
  if exp < now + lease then
    redis.call('zadd', exps, now + lease, attempt)
  end
  if redis.call('pttl', holds) < lease then
    redis.call('pexpire', holds, lease)
  end
  if redis.call('pttl', exps) < lease then
    redis.call('pexpire', exps, lease)
  end
  return 1
end
