-- Prepended to every script: Redis calls whose errors name the one thing in
-- the way, in a form the client decodes into a typed error:
--   FLWRONGTYPE TYPE KEY   KEY holds a value of another TYPE
--   FLBADFENCE KEY         KEY holds a fence that is not a canonical integer
--   FLFENCEMAX KEY         KEY holds a fence at or above 2^53 - 1
--   FLNOPERM COMMAND       the ACL user may not run COMMAND
--   FLNOKEY KEY            the ACL user may not access KEY as COMMAND does
-- Any other error is passed on as the server gave it. Every script checks
-- the keys it writes before its first write, so such an error changes
-- nothing (Redis does not roll a script back).

local function fail(code)
  error({err = code})
end

-- Fails naming KEY and the type it holds.
local function wrong_type(key)
  fail('FLWRONGTYPE ' .. redis.call('TYPE', key)['ok'] .. ' ' .. key)
end

-- A key this call has set and must delete again if a later call fails
-- (grant.lua: a lock whose fence could not be stored). Lua's pcall cannot
-- do this: Redis turns the error it catches into a string.
local undo = nil

-- redis.call, with the first argument taken as the key an error names.
local function call(cmd, ...)
  local r = redis.pcall(cmd, ...)
  if type(r) == 'table' and r.err then
    if undo then redis.pcall('DEL', undo) end
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then wrong_type((...)) end
    if string.find(r.err, "can't run this command", 1, true) then fail('FLNOPERM ' .. cmd) end
    if string.find(r.err, "can't access at least one of the keys", 1, true) then
      fail('FLNOKEY ' .. (...))
    end
    error(r)
  end
  return r
end

-- Whether KEY exists; fails if it holds something other than WANT.
local function check_type(key, want)
  local t = call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then fail('FLWRONGTYPE ' .. t .. ' ' .. key) end
  return t ~= 'none'
end
