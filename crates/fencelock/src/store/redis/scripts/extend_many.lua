-- Compare-and-pexpire of many leases in one call (the client's keeper
-- renews every lease that is due in one tick at once). After common.lua.
-- KEYS: the lock keys (on a Cluster, all of one slot).
local ttl_ms = ARGV[1]         -- the new ttl of every lease of the call
-- ARGV[1 + i]: the exact lock value granted for KEYS[i].
--
-- Returns the leases it did not extend, as a flat list of pairs
-- {i, code, …}: code 0 absent, -1 anything else there (another holder, or a
-- value of another type); every lease not listed was extended (extend.lua's
-- 1). The common reply, all extended, is empty: building and sending a code
-- per lease cost Redis a fifth of the call. Never re-creates an expired
-- lock, never touches another holder's, and never changes a fence.

local out = {}
for i, lock in ipairs(KEYS) do
  local held = redis.pcall('GET', lock)
  if held == ARGV[i + 1] then
    -- redis.pcall directly: this runs for every lease of the client every
    -- third of its ttl. A failure (an ACL) is raised again through call(),
    -- which names it.
    if redis.pcall('PEXPIRE', lock, ttl_ms) ~= 1 then call('PEXPIRE', lock, ttl_ms) end
  else
    out[#out + 1] = i
    if held then out[#out + 1] = -1 else out[#out + 1] = 0 end
  end
end
return out
