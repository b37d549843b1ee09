-- Renew many grants in one script: a watchdog chunk (up to 1,000 grants, one round trip) or an
-- extend (one). renew.lua (renew_mutex) and expiring_renew.lua (renew_expiring) are put in
-- front of this at compile time: each grant is checked (attempt id and token) and renewed
-- exactly as a lone renewal would be, and a stale grant is answered 0, never renewed.
-- ARGV: 4 values per grant: family ('m' a mutex grant: 1 key, the lock hash; 'e' a read-write
-- lock or semaphore grant: 2 keys, the holds hash and the expiries zset; a dialect's grant
-- (scripts/dialect/renew.lua): 'r' Redisson's, 2 keys, the lock hash and dlock's holder
-- names, 'p' python-redis-lock's, 1 key, with the grant's field or id in the attempt id's
-- place), attempt id, token, lease ms. KEYS: the grants' keys, in the same order.
-- Returns a string of one character per grant, in order: '1' renewed, '0' not held.
local out = {}
local k = 1
local now
for i = 1, #ARGV, 4 do
  local attempt, token, lease = ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local r
  if ARGV[i] == 'm' then
    r = renew_mutex(KEYS[k], attempt, token, lease)
    k = k + 1
  elseif ARGV[i] == 'r' then
    r = renew_redisson(KEYS[k], KEYS[k + 1], attempt, lease)
    k = k + 2
  elseif ARGV[i] == 'p' then
    r = renew_pyrl(KEYS[k], attempt, lease)
    k = k + 1
  else
    if not now then
      local t = redis.call('time')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    r = renew_expiring(KEYS[k], KEYS[k + 1], attempt, token, lease, now)
    k = k + 2
  end
  out[#out + 1] = r
end
return table.concat(out)
