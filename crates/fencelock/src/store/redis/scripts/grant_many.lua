-- Grant, for many callers of one client at once (the coalescer sends the
-- grants that queued while its grant calls in flight were at their limit
-- as one call):
-- grant_free.lua's case for each item (and grant_fast.lua's refusal), and
-- nothing else. After fence_clock.lua and fast_helpers.lua alone (no
-- common.lua, no prelude.lua): what this saves is Redis's fixed cost per
-- script call, so each item must cost no more than grant_free.lua does
-- (the helpers' closures are made once per call, not per item).
-- KEYS[i]: the lock key of item i (on a Cluster, all of one slot).
-- ARGV[3i-2], ARGV[3i-1], ARGV[3i]: item i's mint (ARGV[1] of grant.lua,
-- always clock fences here), its holder token, its ttl in ms. Every item is
-- a caller that never queues (no queue member) and is not fair.
--
-- Returns a code and a value per item, in order, all in one flat array
-- (code 1, value 1, code 2, value 2, …: a table per item would cost more):
--   1, fence    granted (clock_fence, as grant_free.lua mints it)
--   0, pttl     held by another holder: grant.lua's reply for a caller
--               that does not queue (nothing written)
--   3, 0        not settled here, and nothing written for it: the client
--               sends it alone through grant.lua, which reads again and
--               decides, naming what is wrong (a fence key that is not a
--               canonical integer below 2^53, a lock key of another type,
--               a retry whose token already holds the lock, any error)
--   4, err      the fence could not be stored (an ACL that lets the user
--               write the lock key only): the lock was deleted again, and
--               this is the error
-- Every Redis call of an item goes through redis.pcall, so one item's
-- error never fails its neighbours.

local now = nil                -- TIME, read once for the whole call
local out = {}
for i, lock in ipairs(KEYS) do
  local mint, token, ttl_ms = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local code, value = 3, 0
  local n = fast_last_fence(lock)
  if n and now == nil then
    local t = redis.pcall('TIME')
    now = not t.err and t[1] * 1000000 + t[2]
  end
  if n and now then
    local f = clock_fence(n, now)
    local fs = string.format('%d', f)
    local tagged = string.byte(mint, 2) == MINT_TAGGED
    local v = token
    if tagged then v = v .. ':' .. fs end
    local held = redis.pcall('SET', lock, v, 'NX', 'PX', ttl_ms, 'GET')
    if held == false then
      -- Taken. The fence key held a string or nothing: no wrong type here.
      local stored = fast_store_fence(lock, fs, mint)
      if stored.err then
        -- Undo the grant (SET NX found the key absent): a lock must never
        -- stand without its fence stored (see grant.lua).
        redis.pcall('DEL', lock)
        local err = stored.err
        if string.find(err, "can't run this command", 1, true) then
          err = 'FLNOPERM SET'
        elseif string.find(err, "can't access at least one of the keys", 1, true) then
          err = 'FLNOKEY ' .. lock .. ':fence'
        end
        code, value = 4, err
      else
        code, value = 1, f
      end
    elseif type(held) == 'string' then
      -- Held. By this token (a retry of a grant whose reply was lost):
      -- grant.lua gives the same grant back and restarts its lease.
      local pttl = fast_time_left_of_other(lock, held, token, tagged)
      if pttl then code, value = 0, pttl end
    end
  end
  out[2 * i - 1] = code
  out[2 * i] = value
end
return out
