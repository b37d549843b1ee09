-- dialect=redisson: release one grant (its field `ATTEMPT_UUID:TOKEN`), or give back whatever
-- grant an attempt got (a give-up names the attempt only: the field's prefix). As Redisson's
-- unlock of a count of 1: the hash is deleted and Redisson's unlock message (0) is published on
-- its channel, which wakes Redisson's waiters and dlock's alike.
-- KEYS[1] the lock hash NAME, KEYS[2] dlock's holder names (see redisson_acquire.lua)
-- ARGV[1] the field (release) or `ATTEMPT_UUID:` (giveup), ARGV[2] Redisson's channel
-- `redisson_lock__channel:{NAME}`, ARGV[3] 'release' or 'giveup'
-- release returns {1, 0} released, {0, 0} no lock (expired), {3, 0} another holder;
-- giveup returns {1, 0} if it gave back a grant of the attempt, else {0, 0}.
local field = ARGV[1]
if ARGV[3] == 'giveup' then
  field = nil
  for _, f in ipairs(redis.call('hkeys', KEYS[1])) do
    if string.sub(f, 1, #ARGV[1]) == ARGV[1] then
      field = f
    end
  end
  if not field then
    return {0, 0}
  end
elseif redis.call('hexists', KEYS[1], field) == 0 then
  if redis.call('exists', KEYS[1]) == 0 then
    return {0, 0}
  end
  return {3, 0}
end
redis.call('del', KEYS[1])
redis.call('del', KEYS[2])
redis.call('publish', ARGV[2], '0')
return {1, 0}
