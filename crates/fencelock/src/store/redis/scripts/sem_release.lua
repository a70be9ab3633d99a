-- Release of a semaphore's permit or a read-write lock's reader or writer
-- (both "permits" here), or a waiter leaving its queue. After common.lua
-- and prelude.lua (KEYS[1] and the permit format are sem_grant.lua's and
-- rw_grant.lua's).
local wake_prefix = LOCK .. ':wake:'  -- wake channel = wake_prefix .. CLIENT
-- ARGV[1]: the mint and how to wake waiters, as in release.lua: the
-- publish command, "PUBLISH" or "SPUBLISH" (Cluster), between two spaces
-- (the starvation threshold after it is not read: a semaphore hands no
-- slot over).
local publish = string.match(ARGV[1], ' (%u+) ')
local slot = ARGV[2]     -- the released field (a slot, "w", "rN"), or "" for a waiter that leaves
local ident = ARGV[3]    -- "TOKEN:FENCE" of the permit, or the leaving member
--
-- A release returns 1 when released, 0 when the slot's permit had lapsed
-- (whoever held it) or is gone, -1 when another holder's live permit is
-- there, which it never touches. A leave returns 1 if the member was queued, 0 otherwise.
-- Either way, the first live waiters, one per free slot, are woken: they
-- take a slot with their own grant (in fair mode the free slots are
-- reserved for them in queue order, see sem_grant.lua).

local kind = call('TYPE', LOCK)['ok']
if kind ~= 'hash' and kind ~= 'none' then
  if slot ~= '' then return -1 end
  kind = 'none'
end
local now_ms = math.floor(now_us() / 1000)
local result
if slot ~= '' then
  local held = kind == 'hash' and call('HGET', LOCK, slot)
  if not held then return 0 end
  -- A lapsed permit is free whoever held it: it goes, and the caller's
  -- permit (if it was) was not released but lost.
  local who, deadline = string.match(held, '^(.*):(%d+)$')
  local lapsed = not deadline or tonumber(deadline) <= now_ms
  if not lapsed and who ~= ident then return -1 end
  call('HDEL', LOCK, slot)
  result = lapsed and 0 or 1
else
  queue_exists(true)
  result = call('ZREM', QUEUE, ident)
  call('ZREM', WAITERS, ident)
end
if kind ~= 'hash' then return result end
local permits, rw, live, writer = 0, false, 0, false
local fields = call('HGETALL', LOCK)
for i = 1, #fields, 2 do
  if fields[i] == 'permits' then
    permits = tonumber(fields[i + 1]) or 0
  elseif fields[i] == 'rw' then
    rw = true
  else
    local deadline = tonumber(string.match(fields[i + 1], ':(%d+)$'))
    if deadline and deadline > now_ms then
      live = live + 1
      if fields[i] == 'w' then writer = true end
    end
  end
end
if live == 0 then
  -- Nobody holds a permit: the key goes (and with it the permit count).
  call('DEL', LOCK)
end
-- How many waiters may get in now: a semaphore's free slots; a read-write
-- lock's readers once no writer holds it (rw_grant.lua).
local free
if rw then free = writer and 0 or 16 else free = math.min(permits - live, 16) end
if free > 0 and queue_exists(false) then
  for _, head in ipairs(live_heads(free, now_ms)) do
    -- A writer can get in only when nobody holds the lock, and the
    -- readers behind it wait for it: the wake-ups end there.
    local stop = rw and waits_to_write(head)
    if not stop or live == 0 then
      local client, waiter = string.match(head, '^([^:]+):([^:]+)')
      -- pcall: a wake-up is best effort (waiters retry on their own).
      if client then redis.pcall(publish, wake_prefix .. client, waiter) end
    end
    if stop then break end
  end
end
return result
