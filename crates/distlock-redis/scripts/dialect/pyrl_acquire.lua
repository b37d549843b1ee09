-- dialect=python-redis-lock: acquire for one attempt. One round trip.
-- The lock is python-redis-lock's own key: a string `lock:NAME` holding the holder's id, set
-- only if absent, with an expiry (python-redis-lock's own expire is optional: a key without
-- one never frees itself). A dlock grant's id is `dlock:ATTEMPT:TOKEN:OWNER`.
-- KEYS[1] `lock:NAME`, KEYS[2] dlock's fencing counter (fence.lua), KEYS[3] the attempt's end
-- record (src/ended.rs)
-- ARGV[1] `dlock:ATTEMPT:`, ARGV[2] the dlock owner, ARGV[3] lease ms
-- Returns {1, token} granted to this attempt (a retry of it gets the same token and never
-- shortens the lease); {0, pttl} held (-1: a holder without expiry), or the attempt ended.
local prefix, lease = ARGV[1], tonumber(ARGV[3])
local cur = redis.call('get', KEYS[1])
if cur then
  if string.sub(cur, 1, #prefix) == prefix then
    local token = tonumber(string.match(string.sub(cur, #prefix + 1), '^(%d+):'))
    if token then
      if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
      end
      return {1, token}
    end
  end
  return {0, redis.call('pttl', KEYS[1])}
end
if redis.call('exists', KEYS[3]) == 1 then
  return {0, -2}
end
local token = next_token(KEYS[2], redis.call('time'), lease, 1)
redis.call('set', KEYS[1], prefix .. string.format('%d', token) .. ':' .. ARGV[2], 'PX', lease)
return {1, token}
