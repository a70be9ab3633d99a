-- A waiter leaves the wait queue (it gave up, or its wait was cancelled). If
-- the lock is free, the next head is woken so it is not held up by the one
-- that left.
--
-- KEYS[1] lock key, KEYS[2] wait queue, KEYS[3] waiter leases
-- ARGV[1] waiter id "CLIENT:WAITER", ARGV[2] wake channel prefix,
-- ARGV[3] "PUBLISH" or "SPUBLISH"
-- Returns 1 if the waiter was queued, 0 otherwise.
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if removed == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    local sep = string.find(head, ':', 1, true)
    if sep then
      redis.call(ARGV[3], ARGV[2] .. string.sub(head, 1, sep - 1), string.sub(head, sep + 1))
    end
  end
end
return removed
