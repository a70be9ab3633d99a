-- The torture resource's state in one atomic read: the hash and its whole
-- audit list.
-- KEYS[1] the resource hash, KEYS[2] its audit list; ARGV[1] the number of
-- semaphore slots (0 or absent: a mutex's resource).
-- Returns {value or false, fence or false, holder or false, {entries...},
-- {value:0, fence:0, holder:0, value:1, ...}} (each false when absent).
local cur = redis.call('HMGET', KEYS[1], 'value', 'fence', 'holder')
local slots = {}
for s = 0, (tonumber(ARGV[1] or '0') or 0) - 1 do
  local v = redis.call('HMGET', KEYS[1], 'value:' .. s, 'fence:' .. s, 'holder:' .. s)
  slots[#slots + 1] = v[1]
  slots[#slots + 1] = v[2]
  slots[#slots + 1] = v[3]
end
return {cur[1], cur[2], cur[3], redis.call('LRANGE', KEYS[2], 0, -1), slots}
