-- Grant, common cases first (after fast_helpers.lua; prepended to common.lua,
-- prelude.lua and grant.lua, which it documents nothing beyond): clock
-- fences, a caller that is neither fair nor queued. It runs before the
-- shared helpers are defined, because creating them costs more Redis time
-- than the calls themselves (each `local function` is a new closure per
-- call): a free lock is granted in four calls (GET fence, TIME, SET NX GET,
-- SET fence), and a lock held by another is refused in one more (PTTL) when
-- the caller does not queue (no queue member: a poller, or a notify
-- waiter's first attempt), as grant.lua would refuse it. Anything unusual
-- (a fence key that is not a canonical integer below 2^53, a lock held by
-- this token, a caller that queues, an error) falls through to the full
-- script below, which reads again and decides, naming what is wrong.
-- Nothing is written before the SET that takes the lock, and a
-- fallen-through call has written nothing (a lock whose fence could not be
-- stored is deleted again).
do
  local mint = ARGV[1]
  -- Clock fences ("c"), not fair, not queued (ARGV 5-7, see grant.lua).
  if string.byte(mint, 1) == MINT_CLOCK and ARGV[4] ~= 'fair'
    and not ((ARGV[5] or '') ~= '' and ARGV[7] == '1') then
    local n, last = fast_last_fence(KEYS[1])
    local t = n and redis.pcall('TIME')
    if t and not t.err then
      local f = clock_fence(n, tonumber(t[1]) * 1000000 + tonumber(t[2]))
      local fs = string.format('%d', f)
      local token = ARGV[2]
      local v = token
      local tagged = string.byte(mint, 2) == MINT_TAGGED
      if tagged then v = v .. ':' .. fs end
      local held = redis.pcall('SET', KEYS[1], v, 'NX', 'PX', ARGV[3], 'GET')
      if held == false then
        -- Taken (SET replied nil: the key was absent). The fence key held a
        -- string or nothing, so this SET cannot meet a wrong type.
        local stored = fast_store_fence(KEYS[1], fs, mint)
        if not (type(stored) == 'table' and stored.err) then return f end
        -- The fence could not be stored (an ACL that lets the user write
        -- the lock key only): undo the grant (SET NX found the key absent)
        -- and fall through: grant.lua tries again, undoes again and names
        -- what is missing.
        redis.pcall('DEL', KEYS[1])
      elseif type(held) == 'string' and (ARGV[5] or '') == '' then
        -- Held, and the caller does not queue. By another holder: refused,
        -- with the holder's time left and the fence stored now. By this
        -- token (a retry whose first reply was lost): grant.lua gives the
        -- same grant back.
        local pttl = fast_time_left_of_other(KEYS[1], held, token, tagged)
        if pttl then return {0, pttl, last} end
      end
    end
  end
end
