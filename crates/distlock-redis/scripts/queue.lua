-- Wait queues: a sorted set ATTEMPT -> arrival ms. Put in front of acquire.lua and expiring.lua
-- (src/scripts.rs), the scripts that queue.
-- Queues attempt m in `queue` at `now` ms, or leaves it where it is if it is queued already.
-- A newcomer's score is above every score in the queue: arrivals within one millisecond (or
-- after the clock stepped back) would otherwise tie, and a sorted set orders ties by member —
-- a random attempt id, not the arrival — so a waiter could be passed by one that came after
-- it. Scores stay milliseconds (with a fraction), so patience and `inspect` read them as times.
local function arrive(queue, m, now)
  if redis.call('zscore', queue, m) then
    return
  end
  local score = now
  local last = tonumber(redis.call('zrange', queue, -1, -1, 'WITHSCORES')[2])
  if last and last >= score then
    score = last + 0.001
  end
  redis.call('zadd', queue, string.format('%.3f', score), m)
end
