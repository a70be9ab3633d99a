-- Leave: a waiter gives up (timed out, failed or cancelled). If the lock was
-- handed to it meanwhile, it is released; if the lock is free, it is passed
-- on, so nobody waits for a waiter that is gone. After common.lua and
-- prelude.lua (KEYS and ARGV[1] are documented there).
local wake_prefix = LOCK .. ':wake:'  -- wake channel = wake_prefix .. CLIENT
-- ARGV[1]: the mint and how to pass the lock on, as in release.lua.
local publish, starving_us = string.match(ARGV[1], ' (%u+) (%d+)$')
starving_us = tonumber(starving_us)
local member = ARGV[2]         -- the leaving waiter's queue member
local token = ARGV[3]          -- its holder token
--
-- Returns 2 if a lock handed to this waiter was released, 1 if it was
-- queued, 0 otherwise.

local held = redis.pcall('GET', LOCK)
-- A lock key of another type is nobody's lock: nothing to release or pass on.
local foreign = type(held) == 'table'
queue_exists(true)
local removed = call('ZREM', QUEUE, member)
call('ZREM', WAITERS, member)
local handed = held and not foreign and granted_to(held, token)
if handed then
  call('DEL', LOCK)
  removed = 2
end
if handed or not held then
  pass_on(wake_prefix, publish, starving_us)
end
return removed
