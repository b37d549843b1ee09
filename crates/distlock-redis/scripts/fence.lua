-- Fencing tokens: put in front of every script that grants or writes a fencing counter
-- (src/scripts.rs, after the line that sets FENCE_MARGIN_MS), so that one copy decides every
-- token of every kind, single server and Redlock node alike.
-- The rule: a grant's token is max(counter + 1, the server's TIME in µs). Above every token
-- the counter saw; and when the counter was rolled back (a restart from an older snapshot, the
-- AOF fsync window, a failover to a replica that missed the last grants, a counter set back by
-- hand) or has expired, still above every token issued before, as long as the clock now reads
-- later than the clocks that issued those tokens read then (docs/redis-lock.md, "Fencing
-- tokens": the clock assumption). Each write gives the counter FENCE_MARGIN_MS past the end of
-- the lease of the grant that made it (as granted; renewals do not touch it), then it expires:
-- by then the clock is above every token it handed out.

-- Sets counter `key` to `value`, living `lease` ms + the margin from now.
local function keep_fence(key, value, lease)
  redis.call('set', key, string.format('%d', value), 'PX', tonumber(lease) + FENCE_MARGIN_MS)
end

-- The clock floor of a token at server time `t` (TIME's reply, read once per script): the clock
-- in µs, rounded down to a multiple of `step` µs. A single server floors by the µs itself
-- (step 1); Redlock's vote in steps (quorum_acquire.lua), so that nodes whose counters agree
-- hand out one token without a raise round, which the µs of different nodes' clocks never
-- would. Tokens of a step stay below the next step's floor (fewer grants than µs in a step).
local function clock_floor(t, step)
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return now - now % step
end

-- The next fencing token of counter `key` at server time `t`, floored in steps of `step` µs
-- (clock_floor) — by the µs itself where there is no counter (a name's first grant, or a
-- counter expired or lost with the data: nothing is left to agree on). Writes nothing. A
-- counter that does not hold a number (another application's key) fails the script before
-- anything is written. Lua's arithmetic reads TIME's strings itself (no tonumber calls: each
-- C call is a measurable share of an uncontended grant's server time).
local function fence_token(key, t, step)
  local stored = redis.call('get', key)
  local now = t[1] * 1000000 + t[2]
  if not stored then
    return now
  end
  local counter = tonumber(stored)
  if not counter or counter < 0 or counter % 1 ~= 0 then
    error('dlock: the fencing counter ' .. key .. ' does not hold a number')
  end
  local floor = now - now % step
  if counter + 1 > floor then
    return counter + 1
  end
  return floor
end

-- The next fencing token of counter `key` (fence_token, step 1 µs: a single server's), the
-- counter left at it for `px` ms (a string: the grant's lease + FENCE_MARGIN_MS, made by the
-- client). Returns the token and its decimal string.
local function grant_token(key, t, px)
  local token = fence_token(key, t, 1)
  local s = string.format('%d', token)
  redis.call('set', key, s, 'PX', px)
  return token, s
end

-- The next fencing token of counter `key` for a grant of `lease` ms, at server time `t`, floored
-- in steps of `step` µs (fence_token); the counter is left at it.
local function next_token(key, t, lease, step)
  local token = fence_token(key, t, step)
  keep_fence(key, token, lease)
  return token
end
