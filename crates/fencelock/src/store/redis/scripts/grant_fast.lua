-- Grant, a refusal without the full script (after grant_free.lua and
-- fast_helpers.lua; prepended to common.lua, prelude.lua and grant.lua):
-- grant_free.lua found the lock held (`free_held`), and the caller does not
-- queue (no queue member: a poller, or a notify waiter's first attempt).
-- Held by another holder: refused in one more call (PTTL), with the
-- holder's time left and the fence stored now, as grant.lua would refuse
-- it. Held by this token (a retry whose first reply was lost): grant.lua
-- gives the same grant back.
if free_held and (ARGV[5] or '') == '' then
  local pttl = fast_time_left_of_other(KEYS[1], free_held, ARGV[2],
    string.byte(ARGV[1], 2) == MINT_TAGGED)
  if pttl then return {0, pttl, free_last} end
end
