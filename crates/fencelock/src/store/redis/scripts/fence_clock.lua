-- Prepended to every script that may mint a fence (grant_free.lua,
-- release_fast.lua, grant_many.lua and prelude.lua's full scripts use it):
-- the bytes of the mint argument, and the clock-floored fence. One
-- function, so one closure per call: each `local function` is a closure
-- made on every call, about as much Redis work as a call to Redis itself,
-- which is why the common cases run before the other helpers exist.

-- ARGV[1] of those scripts, "mint" (see prelude.lua: fence mode, lock
-- value format, fence key retention, e.g. "ct86400000"), is read by its
-- first two bytes:
local MINT_CLOCK = 99    -- string.byte('c'): clock-floored fences
local MINT_TAGGED = 116  -- string.byte('t'): the tagged value TOKEN:FENCE

-- The clock-floored fence after the last one issued, LAST (0 for none),
-- at server time NOW in µs (docs/design.md §2.3): if the fence key is lost
-- (a restart without persistence, a failover, eviction, expiry), the next
-- fence is still above every fence issued before, as long as the server
-- clock does not step back. Values stay below 2^53, exact in Lua doubles.
-- The one place the formula is written.
local function clock_fence(last, now)
  return math.max(last + 1, now)
end
