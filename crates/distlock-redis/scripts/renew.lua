-- Mutex: renew one grant (watchdog tick or extend). A function of renew_many.lua, which puts
-- it in front of its loop at compile time.
-- key: lock hash {attempt, token, owner}; attempt id, token (strings), lease ms (number).
-- Returns 1 renewed (the lease runs at least `lease` from now; never shortened), 0 not held.
local function renew_mutex(key, attempt, token, lease)
  local held = redis.call('hmget', key, 'attempt', 'token')
  if held[1] ~= attempt or held[2] ~= token then
    return 0
  end
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
  return 1
end
