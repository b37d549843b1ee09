-- Fencing tokens: put in front of every script that grants or writes a fencing counter
-- (src/scripts.rs, after the line that sets FENCE_MARGIN_MS), so that one copy decides every
-- token of every kind, single server and Redlock node alike.
-- The rule: a grant's token is max(counter + 1, the server's TIME in µs). Above every token
-- the counter saw; and when the counter was rolled back (a restart from an older snapshot, the
-- AOF fsync window, a failover to a replica that missed the last grants, a counter set back by
-- hand) or has expired, still above every token issued before, as long as the clock now reads
-- later than the clocks that issued those tokens read then (docs/redis-family.md, "Fencing
-- tokens": the clock assumption). Each write gives the counter FENCE_MARGIN_MS past the end of
-- the lease of the grant that made it (as granted; renewals do not touch it), then it expires:
-- by then the clock is above every token it handed out.

-- Sets counter `key` to `value`, living `lease` ms + the margin from now.
local function keep_fence(key, value, lease)
  redis.call('set', key, string.format('%d', value), 'PX', tonumber(lease) + FENCE_MARGIN_MS)
end

-- The next fencing token of counter `key` for a grant of `lease` ms, at server time `t` (TIME's
-- reply, read once per script); the counter is left at it. A counter that does not hold a
-- number (another application's key) fails the script before this writes anything.
local function next_token(key, t, lease)
  local stored = redis.call('get', key)
  local counter = 0
  if stored then
    counter = string.match(stored, '^%d+$') and tonumber(stored)
    if not counter then
      error('dlock: the fencing counter ' .. key .. ' does not hold a number')
    end
  end
  local token = math.max(counter + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  keep_fence(key, token, lease)
  return token
end
