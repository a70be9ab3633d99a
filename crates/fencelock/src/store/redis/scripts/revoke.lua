-- Revoke: take a lock away from whoever holds it, without its token. After
-- fence_clock.lua, fast_helpers.lua, common.lua and prelude.lua (KEYS and ARGV[1] are
-- documented there). In one atomic step:
--   1. mint a fence above every fence issued for the name and store it, so
--      every later grant's fence is above it (the revocation fence);
--   2. delete the lock, whoever holds it (a read-write lock's writer or
--      all its readers);
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
-- ARGV[1]: the mint and how to pass the lock on, as in release.lua
-- ("ct86400000 PUBLISH 10000").
-- Returns {FENCE, HOLDER, HELD_FENCE}: the revocation fence (decimal text),
-- the public id of the holder deposed (the first 16 hex digits of SHA-1 of
-- its token, never the token) or false when the lock was free, and the
-- deposed holder's fence (decimal text) or false when unknown.
local publish, starving_us = string.match(ARGV[1], ' (%u+) (%d+)$')
starving_us = tonumber(starving_us)

-- Every key is checked before the first write (see common.lua), and the
-- first write is the UNLINK: a user without +unlink changes nothing.
local held, rw = nil, false
if call('TYPE', LOCK)['ok'] == 'hash' and call('HGET', LOCK, 'rw') then
  -- A read-write lock (rw_grant.lua): every holder is deposed, the writer
  -- or all readers. The one reported is the writer, or the lowest reader.
  rw = true
  local t = call('TIME')
  local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  local fields, rank = call('HGETALL', LOCK), nil
  for i = 1, #fields, 2 do
    local who, fence, deadline = string.match(fields[i + 1], '^(.-):(%d+):(%d+)$')
    local n = fields[i] == 'w' and -1 or tonumber(string.sub(fields[i], 2))
    if deadline and tonumber(deadline) > now_ms and n and (not rank or n < rank) then
      held, rank = who .. ':' .. fence, n
    end
  end
else
  -- A semaphore's hash fails here (WRONGTYPE), and the caller names it.
  held = call('GET', LOCK)
end
local queue_live = queue_exists(false)
local last = last_fence()
call('UNLINK', LOCK)
local f = mint(last, now_us())
if queue_live and rw then
  -- Waiters of a read-write lock are woken, as sem_release.lua wakes
  -- them once nobody holds it: the readers at the head and the first
  -- writer.
  for _, head in ipairs(live_heads(16, math.floor(now_us() / 1000))) do
    local client, waiter = string.match(head, '^([^:]+):([^:]+)')
    if client then redis.pcall(publish, LOCK .. ':wake:' .. client, waiter) end
    if waits_to_write(head) then break end
  end
elseif queue_live then
  pass_on(LOCK .. ':wake:', publish, starving_us)
end

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
