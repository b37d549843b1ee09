-- Renewal of a dialect grant: functions of renew_many.lua (put in front of its loop at compile
-- time). Each returns 1 renewed (the lease runs at least `lease` ms from now; never
-- shortened), 0 not held.

-- dialect=redisson: `hash` is Redisson's lock NAME, `names` dlock's holder names beside it,
-- `field` the grant's `ATTEMPT_UUID:TOKEN`.
local function renew_redisson(hash, names, field, lease)
  if redis.call('hexists', hash, field) == 0 then
    return 0
  end
  if redis.call('pttl', hash) < lease then
    redis.call('pexpire', hash, lease)
    redis.call('pexpire', names, lease)
  end
  return 1
end

-- dialect=python-redis-lock: `key` is `lock:NAME`, `id` the grant's whole id.
local function renew_pyrl(key, id, lease)
  if redis.call('get', key) ~= id then
    return 0
  end
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
  return 1
end
