-- Fenced write to a Redis hash resource (DESIGN.md §2.4).
--
-- KEYS[1] resource hash (fields fence, holder, value)
-- ARGV[1] fence (canonical decimal), ARGV[2] holder token,
-- ARGV[3] "write" to set value = ARGV[4], or "register" to record only the
--         fence and holder (claim the resource before a read-modify-write).
--
-- Accepted iff no fence is stored, or fence > stored, or fence == stored and
-- the holder equals the stored holder. A hash without a holder field (written
-- by the guide's script) has an unknown holder, so an equal fence is refused.
-- Returns {1|0, stored_fence_or_false, stored_holder_or_false} as they were
-- before this call.
--
-- Fences are compared as decimal strings (length, then bytes) so that any
-- u64 compares exactly; Lua numbers are doubles.
local cur = redis.call('HMGET', KEYS[1], 'fence', 'holder')
local stored, holder = cur[1], cur[2]
local f = ARGV[1]
local ok
if not stored then
  ok = true
elseif #f ~= #stored then
  ok = #f > #stored
elseif f ~= stored then
  ok = f > stored
else
  ok = (holder ~= false and holder == ARGV[2])
end
if not ok then
  return {0, stored, holder}
end
if ARGV[3] == 'write' then
  redis.call('HSET', KEYS[1], 'fence', f, 'holder', ARGV[2], 'value', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'fence', f, 'holder', ARGV[2])
end
return {1, stored, holder}
