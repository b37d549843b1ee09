-- A forced release of a dialect's lock (`dlock release --force`), whoever holds it, as the
-- peer library's own forced unlock does, waking its waiters the same way. Returns what it
-- removed, for the report: {fields or the id (flattened pairs / one value), PTTL, dlock's holder
-- names (flattened pairs), the fencing counter or false}.
-- redisson: KEYS[1] the hash NAME, KEYS[2] dlock's holder names, KEYS[3] the fencing counter;
--   ARGV[1] 'redisson', ARGV[2] Redisson's channel (message 0, as its forceUnlock).
-- python-redis-lock: KEYS[1] `lock:NAME`, KEYS[2] `lock-signal:NAME`, KEYS[3] the counter;
--   ARGV[1] 'python-redis-lock', ARGV[3] the signal's lifetime in ms (as its reset()).
local pttl = redis.call('pttl', KEYS[1])
local fence = redis.call('get', KEYS[3])
if ARGV[1] == 'redisson' then
  local fields = redis.call('hgetall', KEYS[1])
  local names = redis.call('hgetall', KEYS[2])
  if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', ARGV[2], '0')
  end
  redis.call('del', KEYS[2])
  return {fields, pttl, names, fence}
end
local id = redis.call('get', KEYS[1])
redis.call('del', KEYS[2])
redis.call('lpush', KEYS[2], 1)
redis.call('pexpire', KEYS[2], ARGV[3])
redis.call('del', KEYS[1])
local out = {}
if id then
  out = {id}
end
return {out, pttl, {}, fence}
