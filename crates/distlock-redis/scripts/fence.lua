-- Fencing tokens: put in front of every script that grants or writes a fencing counter
-- (src/scripts.rs, after the line that sets FENCE_MARGIN_MS), with fence_next.lua after it,
-- so that one copy decides every token of every kind, single server and Redlock node alike.
-- This file holds what an uncontended mutex grant calls (fence_token, grant_token): the mutex
-- acquire and the Redlock node's vote (quorum_acquire.lua) run their uncontended grant between
-- the two files, and the mutex release before both, so that the common path makes no Lua
-- closure it does not call (each is a measurable share of the server's cost of a script;
-- docs/redis-lock.md, "Costs").
-- The rule: a grant's token is max(counter + 1, the server's TIME in µs). Above every token
-- the counter saw; and when the counter was rolled back (a restart from an older snapshot, the
-- AOF fsync window, a failover to a replica that missed the last grants, a counter set back by
-- hand) or has expired, still above every token issued before, as long as the clock now reads
-- later than the clocks that issued those tokens read then (docs/redis-lock.md, "Fencing
-- tokens": the clock assumption). Each write gives the counter FENCE_MARGIN_MS past the end of
-- the lease of the grant that made it (as granted; renewals do not touch it), then it expires:
-- by then the clock is above every token it handed out.

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

-- The next fencing token of counter `key` (fence_token's rule, step 1 µs: a single
-- server's) for a grant of `lease` ms (a string) at server time `t`, the counter left at it
-- for the lease + FENCE_MARGIN_MS (a number in a redis.call costs less than one more ARGV
-- element). Returns the token and its decimal string.
-- One call where the clock is above the counter, as it is but for a grant within the µs of the
-- last one or a clock behind it: SET ... GET writes the clock's token and answers the counter
-- it replaced (a redis.call is ~8,000 instructions of an uncontended grant's ~60,000). A
-- counter above the clock is then written again, with counter + 1. A counter that does not hold
-- a number is put back as it was (with the counter's lifetime) and fails the script before the
-- grant is written. Before Redis 6.2 (no SET ... GET) the call fails without writing, and the
-- token is made by fence_token (GET, then SET).
local function grant_token(key, t, lease)
  local px = lease + FENCE_MARGIN_MS
  local now = t[1] * 1000000 + t[2]
  local s = string.format('%d', now)
  local stored = redis.pcall('set', key, s, 'PX', px, 'GET')
  if type(stored) == 'table' then
    -- An error reply, nothing written: no SET ... GET, or a key that is not a string (whose
    -- GET fails the script as it should).
    local token = fence_token(key, t, 1)
    s = string.format('%d', token)
    redis.call('set', key, s, 'PX', px)
    return token, s
  end
  if not stored then
    return now, s
  end
  local counter = tonumber(stored)
  if not counter or counter < 0 or counter % 1 ~= 0 then
    redis.call('set', key, stored, 'KEEPTTL')
    error('dlock: the fencing counter ' .. key .. ' does not hold a number')
  end
  if counter + 1 > now then
    s = string.format('%d', counter + 1)
    redis.call('set', key, s, 'PX', px)
    return counter + 1, s
  end
  return now, s
end
