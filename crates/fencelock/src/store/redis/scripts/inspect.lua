-- Read a lock's state in one atomic step (for status and tests). After
-- common.lua.
--
-- KEYS[1] lock key, KEYS[2] fence key.
-- Returns {lock value or false, pttl of the lock, fence key value or false}.
return {call('GET', KEYS[1]), call('PTTL', KEYS[1]), call('GET', KEYS[2])}
