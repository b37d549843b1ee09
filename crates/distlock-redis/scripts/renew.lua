-- Mutex: renew one grant (watchdog tick or extend). A function of renew_many.lua, which puts
-- it in front of its loop at compile time.
-- key: lock hash {attempt, token, owner}; attempt id, token (strings), lease ms (number).
-- Returns 1 renewed (the lease runs at least `lease` from now; never shortened), 0 not held.
-- From Redis 7.0 one PEXPIRE ... GT renews without a PTTL first (a redis.call is a measurable
-- share of a renewal); before it the option is an error that writes nothing, and the lease is
-- compared by hand.
local function renew_mutex(key, attempt, token, lease)
  local held = redis.call('hmget', key, 'attempt', 'token')
  if held[1] ~= attempt or held[2] ~= token then
    return 0
  end
  if type(redis.pcall('pexpire', key, lease, 'GT')) == 'table' and redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
  return 1
end
