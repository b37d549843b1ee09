-- dialect=redisson, plain mutex (Redisson's RLock): acquire for one attempt. One round trip.
-- The lock is Redisson's own key: a hash NAME whose one field is the holder's id
-- `CLIENT_UUID:THREAD_ID` with its re-entry count, PEXPIRE = the lease. A dlock grant writes
-- the field `ATTEMPT_UUID:TOKEN` (the attempt id written as a UUID, the fencing token in the
-- thread id's place) with count 1: a Redisson client sees another client's thread. Re-entry
-- on the dlock side is counted in the core, so a grant never increments its own field.
-- KEYS[1] the lock hash NAME (Redisson's)
-- KEYS[2] dlock's fencing counter of NAME (fence.lua), in NAME's Cluster slot
-- KEYS[3] dlock's holder names: hash FIELD -> dlock owner, same expiry as the lock (inspect)
-- KEYS[4] the attempt's end record (src/ended.rs): while it exists the attempt gets nothing
-- ARGV[1] the attempt as a UUID, ARGV[2] the dlock owner, ARGV[3] lease ms
-- Returns {1, token} granted to this attempt (also when it holds already: a retried request
-- after a lost reply gets the same token and never shortens the lease); {0, pttl} held by
-- another field (PTTL of the hash, as Redisson's tryLock answers) or the attempt has ended.
local prefix = ARGV[1] .. ':'
local lease = tonumber(ARGV[3])
local fields = redis.call('hkeys', KEYS[1])
for _, f in ipairs(fields) do
  if string.sub(f, 1, #prefix) == prefix then
    local token = tonumber(string.match(string.sub(f, #prefix + 1), '^%d+$'))
    if token then
      if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
        redis.call('pexpire', KEYS[3], lease)
      end
      return {1, token}
    end
  end
end
if #fields > 0 then
  return {0, redis.call('pttl', KEYS[1])}
end
if redis.call('exists', KEYS[4]) == 1 then
  return {0, -2}
end
local token = next_token(KEYS[2], redis.call('time'), lease, 1)
local field = prefix .. string.format('%d', token)
redis.call('hincrby', KEYS[1], field, 1)
redis.call('pexpire', KEYS[1], lease)
redis.call('del', KEYS[3])
redis.call('hset', KEYS[3], field, ARGV[2])
redis.call('pexpire', KEYS[3], lease)
return {1, token}
