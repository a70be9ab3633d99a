-- Compare-and-delete (DESIGN.md §2.2), then wake the head of the wait queue.
--
-- KEYS[1] lock key, KEYS[2] wait queue, KEYS[3] waiter leases
-- ARGV[1] the exact lock value this holder was granted
-- ARGV[2] wake channel prefix (the head "CLIENT:WAITER" is woken by
--         publishing WAITER on PREFIX .. CLIENT)
-- ARGV[3] "PUBLISH" or "SPUBLISH" (sharded pub/sub on Cluster)
-- Returns 1 when the lock was ours and is now deleted, 0 when it is absent
-- (expired) and -1 when someone else holds it. Never touches another holder.
--
-- Only ONE waiter is woken per release (no thundering herd): the Redis work
-- per release does not grow with the number of waiters.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then
  if v then return -1 end
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if #dead > 0 then
    redis.call('ZREM', KEYS[2], unpack(dead))
    redis.call('ZREM', KEYS[3], unpack(dead))
  end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    local sep = string.find(head, ':', 1, true)
    if sep then
      redis.call(ARGV[3], ARGV[2] .. string.sub(head, 1, sep - 1), string.sub(head, sep + 1))
    end
  end
end
return 1
