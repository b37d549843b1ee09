-- Mutex (plain or fair): acquire for one attempt, or queue the attempt if it will wait.
-- One round trip. Holds are per attempt: no owner counts on the server (re-entry is counted
-- in the client), so a retried request has the effect of one.
-- Lean on purpose: on Redis 7.0 each KEYS or ARGV element costs the server ~1,400
-- instructions and each redis.call ~6,000-8,000, against ~30,000 for a whole acquire+release
-- of a plain SET NX and compare-and-delete (docs/redis-lock.md, "Costs"). So the uncontended
-- grant takes two keys and four arguments, the keys only the other paths touch are named after
-- KEYS[1] (same hash tag, so the same slot), the queueing paths' arguments ride in one, and
-- this file is the uncontended grant alone: src/scripts.rs puts the rest of the prelude and
-- the other paths (acquire_wait.lua) after it.
-- KEYS[1] lock hash {attempt, token, owner[, q]} of the one grant, PEXPIRE = lease (the
--   layout of a Redlock node's hold too). Field q ('1') is set while the grant may have
--   waiters behind it (every path that queues behind a grant, or grants with a queue there,
--   sets it), so that the uncontended release needs no look at the queue.
-- KEYS[2] the attempt's end record NS:{NAME}:ended:ATTEMPT, written by its give-up or release
--   when a request of it may still be on its way (src/ended.rs): while it exists, a request of
--   the attempt is a late one of an attempt nobody waits for any more, and neither gets the
--   lock nor queues (it is answered "held")
-- KEYS[1] .. ':fence' fencing counter (fence.lua: a token is max(counter + 1, TIME in µs); it
--   expires FENCE_MARGIN_MS after the end of the last lease granted)
-- KEYS[1] .. ':queue' wait queue: zset ATTEMPT -> arrival ms (server clock)
-- KEYS[1] .. ':waiters' waiter data: hash ATTEMPT -> "EXPIRY_MS:LEASE_MS:OWNER"
-- ARGV[1] attempt id, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] 'TTL:FAIR:SEQ:WAKE': the waiter
-- ttl in ms (0: do not queue), '1' for a fair lock (a free lock goes to the oldest live
-- waiter), the request's number (the client's, increasing per client), and the waiter's wake
-- channel ('' for none): the channel is kept beside its waiter data in field '>ATTEMPT' and
-- the number of the waiter's latest request the server answered in field '#ATTEMPT' (both
-- written and removed with the data, in the same calls), so that the release that hands it
-- the lock tells it there, naming that request ('h TOKEN ATTEMPT SEQ': the handoff came after
-- the server answered it); without a channel, on KEYS[1]:released:ATTEMPT.
-- An election (keys NS:{NAME}:election...) adds ARGV[5] the candidate's value, stored with
-- the grant (fields value, seq = 0) or in its waiter data ("EXPIRY_MS:LEASE_MS:LEN:VALUE"
-- then OWNER, LEN the value's length in bytes), and ARGV[6] the election's observe channel,
-- told of every new leader ('g'). A mutex passes neither.
-- Returns one integer (a table reply costs the server more than a call): the token (> 0) when
-- granted to this attempt (also when it held it already: a retry after a lost reply, or a
-- handoff it has not heard of); held by another grant: -2 - PTTL (so 0 and -1 are PTTL's
-- -2 and -1, and -2 - p a remaining lease of p ms).
local attempt = ARGV[1]
local value = ARGV[5]
local fence, queue = KEYS[1] .. ':fence', KEYS[1] .. ':queue'

-- The uncontended case first: no grant, no queue, no end record (one EXISTS of the three).
-- There is nobody to defer to and nothing to take out of a queue: grant, in as few calls and
-- Lua steps as the promises allow (the token: TIME and one SET ... GET of the counter; the grant:
-- HSET and PEXPIRE of the hash; no q: there is no queue).
if redis.call('exists', KEYS[1], queue, KEYS[2]) == 0 then
  local token, s = grant_token(fence, redis.call('time'), ARGV[3])
  redis.call('hset', KEYS[1], 'attempt', attempt, 'token', s, 'owner', ARGV[2])
  if value then
    redis.call('hset', KEYS[1], 'value', value, 'seq', '0')
  end
  redis.call('pexpire', KEYS[1], ARGV[3])
  if value then
    redis.call('publish', ARGV[6], 'g')
  end
  return token
end
