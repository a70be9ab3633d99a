-- NEGATIVE CONTROL `unchecked-release`: release without the owner check.
-- Deletes the lock whoever holds it (redis-py #415, laravel #26213).
-- KEYS[1] lock key. Returns 1 if a key was deleted, 0 otherwise.
return redis.call('DEL', KEYS[1])
