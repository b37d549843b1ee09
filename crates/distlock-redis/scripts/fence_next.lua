-- The rest of the fencing prelude, after fence.lua (src/scripts.rs): a counter's write, the
-- clock floor in steps (Redlock's votes), the next token of any grant.

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

-- The next fencing token of counter `key` for a grant of `lease` ms, at server time `t`, floored
-- in steps of `step` µs (fence_token); the counter is left at it.
local function next_token(key, t, lease, step)
  local token = fence_token(key, t, step)
  keep_fence(key, token, lease)
  return token
end
