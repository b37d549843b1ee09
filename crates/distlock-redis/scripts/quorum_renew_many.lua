-- Redlock: renew many grants' holds on this node in one script (a watchdog chunk of up to
-- 1,000 grants, or one). quorum_renew.lua (quorum_renew) is put in front of this at compile
-- time: each grant is checked (attempt id and token) and renewed exactly as a lone renewal
-- would be; a stale grant is answered, never touched.
-- KEYS[1] the lease horizon, then one lock hash per grant, in order.
-- ARGV: 3 values per grant: attempt id, token, lease ms.
-- Returns {flags, tokens...}: flags a string of one character per grant, in order ('1'
-- renewed, '0' this attempt does not hold it here, '2' this attempt holds it here with another
-- token, nothing changed); then, per '2' in order, the token stored with that hold.
local flags, out = {}, {''}
local longest = 0
local k = 2
for i = 1, #ARGV, 3 do
  local lease = tonumber(ARGV[i + 2])
  local r = quorum_renew(KEYS[k], ARGV[i], ARGV[i + 1], lease)
  k = k + 1
  if r == 1 then
    flags[#flags + 1] = '1'
    if lease > longest then
      longest = lease
    end
  elseif r == 0 then
    flags[#flags + 1] = '0'
  else
    flags[#flags + 1] = '2'
    out[#out + 1] = tonumber(r) or 0
  end
end
-- The horizon runs at least as long as the longest lease renewed here (as after one renewal
-- per grant: each raised it to its own lease). Its value: the node's time when it expires, as
-- a vote writes it (quorum_acquire.lua), so that votes need not look at its PTTL.
if longest > 0 and redis.call('pttl', KEYS[1]) < longest then
  local t = redis.call('time')
  local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  redis.call('set', KEYS[1], string.format('%d', now_ms + longest), 'PX', longest)
end
out[1] = table.concat(flags)
return out
