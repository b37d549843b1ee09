-- Redlock: renew one grant's hold on this node (attempt and token must both match) so that
-- its lease runs at least `lease` ms from now; never shortens it (a short extend, or a renewal
-- that arrives after a longer one, changes nothing). A function of quorum_renew_many.lua, which
-- puts it in front of its loop at compile time (and keeps the lease horizon once per script).
-- lock: the lock hash {attempt, token, owner}; attempt id, token (strings), lease ms (number).
-- Returns 1 renewed, 0 this attempt does not hold it here, or the stored token (a string)
-- when this attempt holds it here with another token (nothing changed).
local function quorum_renew(lock, attempt, token, lease)
  -- Another type under the lock's name (foreign data written over the hold) is no hold of
  -- this attempt: answered 0 and left alone, the rest of the script runs on.
  local held = redis.pcall('hmget', lock, 'attempt', 'token')
  if held.err or held[1] ~= attempt then
    return 0
  end
  if held[2] ~= token then
    return held[2] or ''
  end
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  return 1
end
