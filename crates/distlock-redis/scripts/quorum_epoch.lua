-- Redlock: the node epoch, a key that exists only while the node has not lost its data since it
-- was initialised (at cluster start, or after it lost its data, with a quarantine from the
-- lease horizons of a majority of the other nodes). Its value is RANDOM:UNTIL_MS:RUN_ID:
-- UNTIL_MS is the end of the node's restart quarantine by this server's own clock (every
-- client, including one that starts later, refuses to count the node's votes before it), and
-- the run id of the process that created it, so that a restart (even one that kept its data)
-- is recognised by any client.
-- KEYS[1] node epoch
-- ARGV[1] 'create': unless it exists, set it to ARGV[2]:(now + ARGV[4] ms):ARGV[3], but only if
--   this process still has run id ARGV[3] (a process restarted since the initialisation began
--   must be initialised again); 'drop': delete it if it still holds ARGV[2].
-- Returns {1, current value or '', server time in ms} ('create' when the run id matched),
-- {1, ''} ('drop'), or {0, current run id} when 'create' found another run id.
if ARGV[1] == 'create' then
  local run = string.match(redis.call('info', 'server'), 'run_id:(%x+)')
  if run ~= ARGV[3] then
    return {0, run or ''}
  end
  local t = redis.call('time')
  local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
  local value = ARGV[2] .. ':' .. string.format('%.0f', until_ms) .. ':' .. ARGV[3]
  redis.call('set', KEYS[1], value, 'NX')
  return {1, redis.call('get', KEYS[1]) or '', string.format('%.0f', until_ms - tonumber(ARGV[4]))}
end
if redis.call('get', KEYS[1]) == ARGV[2] then
  redis.call('del', KEYS[1])
end
return {1, ''}
