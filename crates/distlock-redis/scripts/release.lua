-- Mutex: release one grant (named by attempt and token), or take an attempt out of the queue
-- and give back a grant made to it. One round trip.
-- With waiters, a release either **hands the lock over** to the oldest live waiter (fresh
-- fencing token, the waiter's own lease) and tells that attempt, and only it ('h TOKEN
-- ATTEMPT SEQ', SEQ the number of the waiter's latest request the server answered, field
-- '#ATTEMPT' of the waiter data), on the wake channel its queue entry names (field '>ATTEMPT' of the waiter data,
-- see acquire.lua; an entry without one: KEYS[1]:released:ATTEMPT) — or, in the plain mutex's
-- contended mode, **frees it and wakes** that waiter alone ('w ATTEMPT'), which then asks like
-- a newcomer: whoever asks first of it and the clients not queued gets it (the releaser
-- included), as Go's sync.Mutex does; a waiter queued behind it waits (acquire_wait.lua).
-- The lock is handed over (strict FIFO) when the oldest live waiter has waited at least
-- ARGV[3] ms (its arrival is its queue score, on the server clock), so no waiter waits much
-- longer than that before the queue serves it (docs/redis-lock.md, "Contended mode"). A fair
-- lock and an election always hand over (ARGV[3] empty). With nobody queued it publishes
-- nothing.
-- KEYS[1] the lock hash; its counter, queue and waiter data are named after it, as in
-- acquire.lua (read only when the grant has a queue behind it), and so is the lock's channel,
-- KEYS[1] .. ':released'. ARGV[1] attempt id, ARGV[2] token ('' for a give-up: any grant of
-- the attempt goes back, and the attempt leaves the queue), ARGV[3] the wait in ms after which
-- releases hand over ('': always); for an election (see acquire.lua) ARGV[4] its observe
-- channel: the new leader's value comes from its waiter data, and every change of leader
-- (handoff, or none left) is published there ('g' / 'r').
-- A release returns 1 released (or handed over), 0 no lock (expired), 3 another grant holds
-- it; a give-up 1 if it gave back a grant of the attempt, else 0. (An integer: a table reply
-- costs the server more than a call.)
local attempt = ARGV[1]
local observe = ARGV[4]

-- The uncontended release first (this grant, and no q: nobody queued behind it, see
-- acquire.lua; HMGET and DEL), before the functions of the other paths are even made.
local held
local release = ARGV[2] ~= ''
if release then
  held = redis.call('hmget', KEYS[1], 'attempt', 'token', 'q')
  if held[1] == attempt and held[2] == ARGV[2] and not held[3] then
    redis.call('del', KEYS[1])
    if observe then
      redis.call('publish', observe, 'r')
    end
    return 1
  end
end
