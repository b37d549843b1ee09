-- Redlock: one node's vote on an acquisition attempt (distlock-redlock). No wait queue (a
-- per-node queue would hand the lock to different waiters on different nodes). The hold is
-- addressed by the attempt id, which is unique forever: a retry of the same attempt finds its
-- own hold and gets it back (never a second hold), and any other attempt, even of the same
-- owner, is another holder (re-entry is counted in the client).
-- KEYS[1] lock hash {attempt, token, owner}, PEXPIRE = lease
-- KEYS[2] fencing counter (never expires, never lowered)
-- KEYS[3] node epoch "RANDOM:UNTIL_MS:RUN_ID" (exists while the node's counters are complete;
--   UNTIL_MS is the end of the node's restart quarantine, by this server's clock)
-- KEYS[4] lease horizon: PX = the longest lease granted or renewed here that may still run
-- ARGV[1] attempt id, ARGV[2] lease ms, ARGV[3] the epoch the client knows, ARGV[4] owner id
-- Returns {-1, 0, 0, 0} the epoch differs: the node lost its data or was re-seeded since the
--   client looked, so its vote must not count (nothing was changed); otherwise
--   {status, counter, x, quarantine_left_ms}:
--   status 1 granted afresh (counter incremented; x = token stored = counter),
--   status 2 this attempt already holds it here (x = the token stored with the hold; the
--     lease now runs at least ARGV[2] from now, never shortened),
--   status 0 another attempt holds it (x = its pttl).
local epoch = redis.call('get', KEYS[3])
if epoch ~= ARGV[3] then
  return {-1, 0, 0, 0}
end
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(string.match(epoch, '^[^:]*:(%d+):')) or 0
local qleft = math.max(0, until_ms - now_ms)
local attempt = ARGV[1]
local lease = tonumber(ARGV[2])

-- Whoever loses this node's data later must stay out of majorities until every lease it may
-- have held has run out: the horizon remembers how long that is (read when seeding).
local function horizon()
  if redis.call('pttl', KEYS[4]) < lease then
    redis.call('set', KEYS[4], ARGV[2], 'PX', lease)
  end
end

if redis.call('exists', KEYS[1]) == 0 then
  if redis.call('exists', KEYS[2]) == 0 then
    -- A counter that is missing (a new name, or a node whose data is gone) starts from the
    -- server's clock in microseconds, above any token this name could have had before.
    redis.call('set', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  -- INCR first: if the counter holds foreign data the script fails before writing anything.
  local c = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', c, 'owner', ARGV[4])
  redis.call('pexpire', KEYS[1], lease)
  horizon()
  return {1, c, c, qleft}
end
local c = tonumber(redis.call('get', KEYS[2]) or '0')
if not c then
  return redis.error_reply('dlock: the fencing counter ' .. KEYS[2] .. ' does not hold a number')
end
if redis.call('hget', KEYS[1], 'attempt') == attempt then
  -- A retry (its earlier reply was lost) or a vote of an earlier round of this attempt: the
  -- same hold, its lease made to run at least `lease` from now, never shortened.
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  horizon()
  return {2, c, tonumber(redis.call('hget', KEYS[1], 'token') or '0') or 0, qleft}
end
return {0, c, redis.call('pttl', KEYS[1]), qleft}
