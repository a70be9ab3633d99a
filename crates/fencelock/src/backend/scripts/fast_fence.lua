-- Prepended to the scripts' common cases (grant_fast.lua, release_fast.lua)
-- and to grant_many.lua, which run before (or without) the shared helpers:
-- one function, so they create one closure per call, not prelude.lua's
-- many.
--
-- The last fence issued for lock key LOCK, as a number: 0 when none is
-- stored; nil when the fence key holds anything but a canonical decimal
-- integer below 2^53 - 1 (another type, '007', '1.5', a value too large),
-- which the full scripts name (FLWRONGTYPE, FLBADFENCE, FLFENCEMAX). The
-- second value is the stored text (nil when none).
local function fast_last_fence(lock)
  local last = redis.pcall('GET', lock .. ':fence')
  if not last then return 0 end
  if type(last) ~= 'string' or #last > 16 or not string.match(last, '^[1-9]%d*$') then
    return nil
  end
  local n = tonumber(last)
  if n >= 9007199254740991 then return nil end
  return n, last
end
