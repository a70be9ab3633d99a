-- Read a semaphore's state in one atomic step (for status and tests).
-- After common.lua. KEYS[1] the semaphore key, KEYS[2] the fence key.
-- Returns {server time in ms, the hash's fields and values (flat), the
-- fence key's value or false}; a key that is not a hash gives no fields.
local t = call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local fields = {}
if call('TYPE', KEYS[1])['ok'] == 'hash' then fields = call('HGETALL', KEYS[1]) end
return {now_ms, fields, call('GET', KEYS[2])}
