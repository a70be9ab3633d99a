-- Read a lock's state in one atomic step (for status and tests).
--
-- KEYS[1] lock key, KEYS[2] fence key.
-- Returns {lock value or false, pttl of the lock, fence key value or false}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
