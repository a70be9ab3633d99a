-- Grant, the most common case first (after fence_clock.lua; then
-- fast_helpers.lua, grant_fast.lua, common.lua, prelude.lua, grant.lua,
-- which it documents nothing beyond): clock fences, a caller that is
-- neither fair nor queued, and a free lock, granted in four calls (GET
-- fence, TIME, SET NX GET, SET fence) before any helper but clock_fence
-- exists (see fence_clock.lua: a helper costs a closure per call, and this
-- is the path every uncontended lock takes). So the fence key is read and
-- written here as fast_last_fence and fast_store_fence in fast_helpers.lua
-- do it, by the same rules. Anything else falls through with nothing
-- written (a lock whose fence could not be stored is deleted again): a
-- held lock with its holder's value in `free_held` (and the stored fence
-- text in `free_last`) for grant_fast.lua's refusal; a fence key that is
-- not a canonical integer below 2^53 - 1, a caller that queues or is fair,
-- counter fences or an error for the full script, which reads again and
-- decides, naming what is wrong.
local free_held, free_last
do
  local mint = ARGV[1]
  local fences, format = string.byte(mint, 1, 2)
  -- Clock fences ("c"), not fair, not queued (ARGV 5-7, see grant.lua).
  if fences == MINT_CLOCK and ARGV[4] ~= 'fair'
    and not ((ARGV[5] or '') ~= '' and ARGV[7] == '1') then
    local lock = KEYS[1]
    local fence_key = lock .. ':fence'
    -- The last fence: 0 when none is stored; false or nil (fall through)
    -- unless it is a canonical decimal integer below 2^53 - 1. A string
    -- has no `err` field (an error reply, a table, has one); `+ 0` is
    -- tonumber for the digits found.
    local last = redis.pcall('GET', fence_key)
    local n = 0
    if last then
      n = not last.err and #last <= 16
        and string.find(last, '^[1-9]%d*$') and last + 0
      if n and n >= 9007199254740991 then n = nil end
    end
    local t = n and redis.pcall('TIME')
    if t and not t.err then
      local f = clock_fence(n, t[1] * 1000000 + t[2])
      local fs = string.format('%d', f)
      local v = ARGV[2]
      if format == MINT_TAGGED then v = v .. ':' .. fs end
      local held = redis.pcall('SET', lock, v, 'NX', 'PX', ARGV[3], 'GET')
      if held == false then
        -- Taken (SET replied nil: the key was absent). The fence key held
        -- a string or nothing, so this SET cannot meet a wrong type. Kept
        -- for the retention in the mint ("0": forever).
        local retention = string.sub(mint, 3)
        local stored
        if retention ~= '0' then
          stored = redis.pcall('SET', fence_key, fs, 'PX', retention)
        else
          stored = redis.pcall('SET', fence_key, fs)
        end
        if not stored.err then return f end
        -- The fence could not be stored (an ACL that lets the user write
        -- the lock key only): undo the grant (SET NX found the key absent)
        -- and fall through: grant.lua tries again, undoes again and names
        -- what is missing.
        redis.pcall('DEL', lock)
      elseif type(held) == 'string' then
        free_held = held
        if last then free_last = last end
      end
    end
  end
end
