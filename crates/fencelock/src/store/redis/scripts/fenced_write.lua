-- Fenced write to a Redis hash resource (docs/design.md §2.4). After common.lua.
local key = KEYS[1]            -- the resource hash (fields fence, holder, value;
                               -- per slot fence:N, holder:N, value:N)
local fence = ARGV[1]          -- the writer's fence, canonical decimal
local op = ARGV[3]             -- "write" (set value = ARGV[4]), "register"
local value = ARGV[4]          -- (fence and holder only: claim the resource
                               -- before a read-modify-write) or "seal"
-- ARGV[5], sent only by a slot view (a semaphore's permits): the slot, in
-- canonical decimal. The call then reads and writes that slot's own pair,
-- fields fence:SLOT, holder:SLOT and value:SLOT, and leaves every other
-- field alone; without it, the hash's own fields, as always. Canonical
-- (no leading zero) so that one slot never names two pairs ("1", "01").
local f_fence, f_holder, f_value = 'fence', 'holder', 'value'
local slot = ARGV[5]
if slot then
  if slot ~= '0' and not string.match(slot, '^[1-9]%d*$') then
    error('slot ' .. slot .. ' is not a canonical decimal')
  end
  f_fence, f_holder, f_value = 'fence:' .. slot, 'holder:' .. slot, 'value:' .. slot
end
-- The writer's public holder id, derived from its secret token here, so
-- that knowing an id (status, top and read show them) is not enough to
-- write as that holder: the first 16 hex digits of SHA-1(token). A seal (a
-- revoke) records the holder "revoked", which no holder id equals (ids are
-- hex digits): every fence up to the sealed one is refused from then on.
local holder = 'revoked'
if op ~= 'seal' then holder = string.sub(redis.sha1hex(ARGV[2]), 1, 16) end
--
-- Accepted iff no fence is stored, or fence > stored, or fence == stored and
-- the holder equals the stored holder; a seal also when fence == stored
-- (whoever wrote it: that holder is the one revoked). A hash without a holder field (written
-- by the guide's script) has an unknown holder, so an equal fence is refused.
-- Returns {1|0, stored_fence_or_false, stored_holder_or_false} as they were
-- before this call.
--
-- Fences are compared as decimal strings (length, then bytes, after leading
-- zeros) so that any u64 compares exactly; Lua numbers are doubles.

local cur = call('HMGET', key, f_fence, f_holder)
local stored, stored_holder = cur[1], cur[2]
local ok
if not stored then
  ok = true
else
  if not string.match(stored, '^%d+$') then fail('FLBADFENCE ' .. key) end
  local s = string.match(stored, '^0*(%d.*)$')
  if #fence ~= #s then
    ok = #fence > #s
  elseif fence ~= s then
    ok = fence > s
  else
    ok = op == 'seal' or (stored_holder ~= false and stored_holder == holder)
  end
end
if not ok then
  return {0, stored, stored_holder}
end
if op == 'write' then
  call('HSET', key, f_fence, fence, f_holder, holder, f_value, value)
else
  call('HSET', key, f_fence, fence, f_holder, holder)
end
return {1, stored, stored_holder}
