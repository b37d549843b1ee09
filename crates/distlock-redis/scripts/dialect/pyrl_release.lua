-- dialect=python-redis-lock: release one grant (its whole id), or give back whatever grant an
-- attempt got (a give-up names the id's prefix `dlock:ATTEMPT:`). As python-redis-lock's own
-- unlock: the signal list `lock-signal:NAME` is made to hold one element (for PEXPIRE ms),
-- which wakes one waiter blocked in BLPOP on it (python-redis-lock's or dlock's), and the lock
-- key is deleted.
-- KEYS[1] `lock:NAME`, KEYS[2] `lock-signal:NAME`
-- ARGV[1] the id (release) or its prefix (giveup), ARGV[2] 'release' or 'giveup', ARGV[3] the
-- signal's lifetime in ms
-- release returns {1, 0} released, {0, 0} no lock (expired), {3, 0} another holder;
-- giveup returns {1, 0} if it gave back a grant of the attempt, else {0, 0}.
local cur = redis.call('get', KEYS[1])
local mine
if ARGV[2] == 'giveup' then
  mine = cur and string.sub(cur, 1, #ARGV[1]) == ARGV[1]
else
  mine = cur == ARGV[1]
end
if not mine then
  if ARGV[2] == 'giveup' or not cur then
    return {0, 0}
  end
  return {3, 0}
end
redis.call('del', KEYS[2])
redis.call('lpush', KEYS[2], 1)
redis.call('pexpire', KEYS[2], ARGV[3])
redis.call('del', KEYS[1])
return {1, 0}
