-- Release, for many leases of one client at once (the coalescer sends the
-- releases that queued while its release calls in flight were at their
-- limit as one call): release.lua's compare-and-delete for each item when
-- nobody waits.
-- Standalone and closure-free (see grant_many.lua).
-- KEYS[i]: the lock key of item i (on a Cluster, all of one slot).
-- ARGV[i]: the exact lock value granted for KEYS[i].
--
-- Returns one code per item, in order, as release.lua does for one: 1
-- released, 0 absent (expired), -1 anything else there (another holder, or
-- a value of another type); or 2: the lock is ours but there is a wait
-- queue to pass it on to (or a call failed), so nothing was written and
-- the client sends it alone through release.lua. Only ever deletes a lock
-- key that holds exactly its item's value.

local out = {}
for i, lock in ipairs(KEYS) do
  local held = redis.pcall('GET', lock)
  if type(held) == 'table' then
    out[i] = -1
  elseif held ~= ARGV[i] then
    if held then out[i] = -1 else out[i] = 0 end
  else
    if redis.pcall('ZCARD', lock .. ':queue') == 0
      and redis.pcall('DEL', lock) == 1 then
      out[i] = 1
    else
      out[i] = 2
    end
  end
end
return out
