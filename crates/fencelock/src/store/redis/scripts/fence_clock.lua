-- Prepended to every script that may mint a fence (grant_free.lua,
-- release_fast.lua, grant_many.lua and prelude.lua's full scripts use it):
-- the bytes of the mint argument, and the clock-floored fence. One
-- function, so one closure per call: each `local function` is a closure
-- made on every call, about as much Redis work as a call to Redis itself,
-- which is why the common cases run before the other helpers exist.
--
-- For the same reason the common paths call as few library functions as
-- they can: on Redis 7.0 each call of tonumber, type, math.max or a string
-- function costs some 400 to 1,000 instructions (measured), as much as an
-- argument of the script call. So TIME's two decimal strings become µs by
-- arithmetic (Lua converts a numeric string exactly as tonumber does), a
-- reply is told from an error by its `err` field, and the mint's two
-- bytes are read in one string.byte.

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
  if last + 1 > now then return last + 1 end
  return now
end
