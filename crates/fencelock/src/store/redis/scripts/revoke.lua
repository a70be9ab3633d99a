-- Revoke: take a lock away from whoever holds it, without its token. After
-- fast_helpers.lua, common.lua and prelude.lua (KEYS and ARGV[1] are
-- documented there). In one atomic step:
--   1. mint a fence above every fence issued for the name and store it, so
--      every later grant's fence is above it (the revocation fence);
--   2. delete the lock, whoever holds it;
--   3. pass the lock on to the head waiter, as a release does (waiters keep
--      their places).
-- The caller then seals the revocation fence at the resources: every fence
-- up to it is refused there, every later grant's is accepted.
--
-- The lock is deleted with UNLINK, which no other fencelock script runs: an
-- ACL rule without +unlink keeps a user from revoking (Redis ACLs cannot
-- tell one script from another). UNLINK runs even when the lock is free,
-- so that the rule holds for every revoke.
--
-- ARGV[2]: how to pass the lock on, as in release.lua ("PUBLISH 500000").
-- Returns {FENCE, HOLDER, HELD_FENCE}: the revocation fence (decimal text),
-- the public id of the holder deposed (the first 16 hex digits of SHA-1 of
-- its token, never the token) or false when the lock was free, and the
-- deposed holder's fence (decimal text) or false when unknown.
local publish, starving_us = string.match(ARGV[2], '^(%u+) (%d+)$')
starving_us = tonumber(starving_us)

-- Every key is checked before the first write (see common.lua), and the
-- first write is the UNLINK: a user without +unlink changes nothing.
local held = call('GET', LOCK)
local queue_live = queue_exists(false)
local last = last_fence()
call('UNLINK', LOCK)
local f = mint(last, now_us())
if queue_live then pass_on(LOCK .. ':wake:', publish, starving_us) end

local holder, held_fence = false, false
if held then
  local token = held
  if FORMAT == 'tagged' then
    local t, hf = string.match(held, '^(.*):(%d+)$')
    if t then token, held_fence = t, hf end
  else
    -- The guide's bare value: the holder's fence is the last one issued.
    held_fence = last or false
  end
  holder = string.sub(redis.sha1hex(token), 1, 16)
end
return {string.format('%d', f), holder, held_fence}
