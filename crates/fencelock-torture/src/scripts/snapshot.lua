-- The torture resource's state in one atomic read: the hash and its whole
-- audit list.
-- KEYS[1] the resource hash, KEYS[2] its audit list.
-- Returns {value or false, fence or false, holder or false, {entries...}}.
local cur = redis.call('HMGET', KEYS[1], 'value', 'fence', 'holder')
return {cur[1], cur[2], cur[3], redis.call('LRANGE', KEYS[2], 0, -1)}
