-- After fence_clock.lua, in the scripts that settle common cases without
-- the full helpers of prelude.lua: release_fast.lua (a lock passed on to a
-- waiter), grant_fast.lua (a refusal) and grant_many.lua (every item of a
-- batch). Three functions, so three closures per call, not prelude.lua's
-- many; the most common cases (grant_free.lua, release_free.lua) run
-- before even these exist.

-- The last fence issued for lock key LOCK, as a number: 0 when none is
-- stored; nil when the fence key holds anything but a canonical decimal
-- integer below 2^53 - 1 (another type, '007', '1.5', a value too large),
-- which the full scripts name (FLWRONGTYPE, FLBADFENCE, FLFENCEMAX). The
-- second value is the stored text (nil when none).
local function fast_last_fence(lock)
  local last = redis.pcall('GET', lock .. ':fence')
  if not last then return 0 end
  -- (See fence_clock.lua on `err` and `+ 0`.)
  if last.err or #last > 16 or not string.find(last, '^[1-9]%d*$') then
    return nil
  end
  local n = last + 0
  if n >= 9007199254740991 then return nil end
  return n, last
end

-- The time left (PTTL) of lock LOCK, held with value HELD by a holder
-- other than TOKEN (`tagged`: values are TOKEN:FENCE), for a refusal; nil
-- when TOKEN holds it (a retry whose first reply was lost: the full script
-- gives the same grant back) or the PTTL fails.
local function fast_time_left_of_other(lock, held, token, tagged)
  local mine
  if tagged then
    mine = string.sub(held, 1, #token + 1) == token .. ':'
  else
    mine = held == token
  end
  if mine then return nil end
  local pttl = redis.pcall('PTTL', lock)
  if type(pttl) == 'number' then return pttl end
  return nil
end

-- Stores fence FS (text) as the last fence issued for lock LOCK, kept for
-- the retention in MINT (ARGV[1] of the scripts, e.g. "ct86400000", or
-- with a pass-on after it, "ct86400000 PUBLISH 10000"; "0": forever); the
-- reply of the SET, an error table if it failed.
local function fast_store_fence(lock, fs, mint)
  local retention = string.match(mint, '^..(%d+)')
  if retention ~= '0' then
    return redis.pcall('SET', lock .. ':fence', fs, 'PX', retention)
  end
  return redis.pcall('SET', lock .. ':fence', fs)
end
