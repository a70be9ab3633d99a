-- Grant, common case first (prepended to common.lua, prelude.lua and
-- grant.lua, which it documents nothing beyond): a free lock, clock fences,
-- a caller that is neither fair nor queued. It runs before the shared
-- helpers are defined, because creating them costs more Redis time than
-- the calls themselves (each `local function` is a new closure per call):
-- here a grant is four calls (GET fence, TIME, SET NX GET, SET fence) and no
-- closure. Anything unusual (a fence key that is not a canonical integer
-- below 2^53, a lock that is held, an error) falls through to the full
-- script below, which reads again and decides, naming what is wrong. Nothing
-- is written before the SET that takes the lock, and a fallen-through call
-- has written nothing (a lock whose fence could not be stored is deleted
-- again).
do
  local mint = ARGV[1]
  -- Clock fences ("c"), not fair, not queued (ARGV 5-7, see grant.lua).
  if string.byte(mint, 1) == 99 and ARGV[4] ~= 'fair'
    and not ((ARGV[5] or '') ~= '' and ARGV[7] == '1') then
    local fence_key = KEYS[1] .. ':fence'
    local last = redis.pcall('GET', fence_key)
    local n = 0
    if last then
      if type(last) ~= 'string' or #last > 16 or not string.match(last, '^[1-9]%d*$') then
        n = nil
      else
        n = tonumber(last)
        if n >= 9007199254740991 then n = nil end
      end
    end
    local t = n and redis.pcall('TIME')
    if t and not t.err then
      local f = math.max(n + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
      local fs = string.format('%d', f)
      local v = ARGV[2]
      -- "t": the tagged format, TOKEN:FENCE.
      if string.byte(mint, 2) == 116 then v = v .. ':' .. fs end
      if redis.pcall('SET', KEYS[1], v, 'NX', 'PX', ARGV[3], 'GET') == false then
        -- Taken (SET replied nil: the key was absent). The fence key held a
        -- string or nothing, so this SET cannot meet a wrong type.
        local retention = string.sub(mint, 3)
        local stored
        if retention ~= '0' then
          stored = redis.pcall('SET', fence_key, fs, 'PX', retention)
        else
          stored = redis.pcall('SET', fence_key, fs)
        end
        if not (type(stored) == 'table' and stored.err) then return {1, f} end
        -- The fence could not be stored (an ACL that lets the user write
        -- the lock key only): undo the grant (SET NX found the key absent)
        -- and fall through: grant.lua tries again, undoes again and names
        -- what is missing.
        redis.pcall('DEL', KEYS[1])
      end
    end
  end
end
