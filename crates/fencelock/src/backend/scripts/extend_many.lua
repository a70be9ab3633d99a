-- Compare-and-pexpire of many leases in one call (the client's keeper
-- renews every lease that is due in one tick at once). After common.lua.
-- KEYS: the lock keys (on a Cluster, all of one slot).
local ttl_ms = ARGV[1]         -- the new ttl of every lease of the call
-- ARGV[1 + i]: the exact lock value granted for KEYS[i].
--
-- Returns one code per key, as extend.lua does for one: 1 extended, 0
-- absent, -1 anything else there (another holder, or a value of another
-- type). Never re-creates an expired lock, never touches another holder's,
-- and never changes a fence.

local out = {}
for i, lock in ipairs(KEYS) do
  local held = redis.pcall('GET', lock)
  if type(held) == 'table' then
    out[i] = -1
  elseif held == ARGV[i + 1] then
    call('PEXPIRE', lock, ttl_ms)
    out[i] = 1
  elseif held then
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
