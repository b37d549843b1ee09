-- Redlock: the node epoch, a key that exists only while the node's fencing counters are known
-- to be complete (created at cluster start, or after the counters were seeded from a majority
-- of the other nodes). Its value ends with the run id of the process that created it, so a
-- restart (even one that kept its data) is recognised by any client.
-- KEYS[1] node epoch
-- ARGV[1] 'create': set it to ARGV[2] unless it exists, but only if this process still has
--   run id ARGV[3] (a process restarted since the seeding began must be seeded again);
--   'drop': delete it if it still holds ARGV[2].
-- Returns {1, current value or ''} ('create' when the run id matched, 'drop' always), or
-- {0, current run id} when 'create' found another run id.
if ARGV[1] == 'create' then
  local run = string.match(redis.call('info', 'server'), 'run_id:(%x+)')
  if run ~= ARGV[3] then
    return {0, run or ''}
  end
  redis.call('set', KEYS[1], ARGV[2], 'NX')
  return {1, redis.call('get', KEYS[1]) or ''}
end
if redis.call('get', KEYS[1]) == ARGV[2] then
  redis.call('del', KEYS[1])
end
return {1, ''}
