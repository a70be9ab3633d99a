-- Read-write lock grant: a reader shares the name with other readers, a
-- writer takes it alone and mints its fence, in one atomic step. After
-- common.lua and prelude.lua (ARGV[1], the fence key and the wait queue
-- are documented there; the queue and its members are the mutex's, with
-- the access before the wait mode: "rfair", "wnotify").
--
-- KEYS[1] is a hash, as a semaphore's (sem_grant.lua): the field `rw`
-- marks it, `w` holds the writer as "TOKEN:FENCE:DEADLINE" and `rN`
-- (N = 0, 1, ...) each reader as "TOKEN:EPOCH:DEADLINE", DEADLINE the
-- server time in ms when it lapses. A reader's EPOCH is the last fence
-- issued when it was granted: every writer granted later mints a greater
-- one, which is how a validated read knows a writer came in. Permits past
-- their DEADLINE count as free in every script (sem_release.lua and
-- sem_extend.lua serve both kinds).
local token = ARGV[2]                  -- the caller's holder token
local ttl_ms = tonumber(ARGV[3])       -- lease ttl in ms
local wait_mode = ARGV[4]              -- "poll", "notify" or "fair"
local writer = ARGV[5] == 'w'          -- "r" a reader, "w" a writer
local member = ARGV[6] or ''           -- the caller's queue member ("" = never queue)
local waiter_lease = tonumber(ARGV[7]) -- ms a queued waiter keeps its place
local queued = member ~= '' and ARGV[8] == '1'
--
-- Returns {1, fence, field} when granted (a writer's fence, a reader's
-- epoch; a retry by a token that holds its side gets its field and fence
-- back, its lease restarted), {0, ms, last} when a holder conflicts (ms:
-- the soonest such a holder lapses), {2, 0, last} when a waiter ahead in
-- the fair queue conflicts, where `last` is the fence stored now (nil:
-- none); {3, 0} when the name is held as a mutex, {4, n} when it has
-- holders as a semaphore of n permits. Refused notify/fair callers are
-- queued (or keep their place).

local kind = call('TYPE', LOCK)['ok']
if kind == 'string' then return {3, 0} end
if kind ~= 'none' and kind ~= 'hash' then fail('FLWRONGTYPE ' .. kind .. ' ' .. LOCK) end
if member ~= '' or wait_mode == 'fair' then queue_exists(true) end
local last = last_fence()

local now = now_us()
local now_ms = math.floor(now / 1000)
local readers, writer_live, live, soonest = {}, false, 0, nil
local permits, mine_field, mine_fence = nil, nil, nil
local lapsed = {}
local fields = call('HGETALL', LOCK)
for i = 1, #fields, 2 do
  local field, value = fields[i], fields[i + 1]
  if field == 'permits' then
    permits = tonumber(value) or 0
  elseif field ~= 'rw' then
    local who, fence, deadline = string.match(value, '^(.-):(%d+):(%d+)$')
    deadline = tonumber(deadline)
    if deadline and deadline > now_ms then
      live = live + 1
      if field == 'w' then writer_live = true else readers[field] = true end
      -- Only a holder the caller cannot share with bounds its wait.
      if (writer or field == 'w') and (not soonest or deadline - now_ms < soonest) then
        soonest = deadline - now_ms
      end
      if who == token and (field == 'w') == writer then
        mine_field, mine_fence = field, tonumber(fence)
      end
    else
      lapsed[#lapsed + 1] = field
    end
  end
end

-- Holds FIELD with FENCE until ttl from now; the key lives as long as its
-- latest holder.
local function hold(field, fence)
  call('HSET', LOCK, field, token .. ':' .. string.format('%d', fence) .. ':'
    .. string.format('%d', now_ms + ttl_ms), 'rw', '1')
  if call('PTTL', LOCK) < ttl_ms then call('PEXPIRE', LOCK, ttl_ms) end
  if queued then dequeue(member) end
end

-- Whether a live waiter ahead of the caller in the fair queue conflicts
-- with it: for a writer any waiter, for a reader a writer (the readers
-- ahead of a writer go first, together). Dead conflicting waiters met on
-- the way are dropped.
local function conflict_ahead()
  -- By score (arrival), not rank: ZRANGE is in the README's ACL rule,
  -- ZRANK is not.
  local arrived = member ~= '' and call('ZSCORE', QUEUE, member)
  local upto = arrived and ('(' .. arrived) or '+inf'
  for _, entry in ipairs(call('ZRANGE', QUEUE, '-inf', upto, 'BYSCORE')) do
    if writer or waits_to_write(entry) then
      local lease_end = tonumber(call('ZSCORE', WAITERS, entry))
      if lease_end and lease_end > now_ms then return true end
      dequeue(entry)
    end
  end
  return false
end

if mine_field then
  hold(mine_field, mine_fence)
  return {1, mine_fence, mine_field}
end
if permits and live > 0 then return {4, permits} end
-- Past every refusal that says nothing was changed: lapsed holders go,
-- and so does a semaphore's permit count once it has none.
if #lapsed > 0 then call('HDEL', LOCK, unpack(lapsed)) end
if permits then call('HDEL', LOCK, 'permits') end
if writer_live or (writer and live > 0) then
  if wait_mode ~= 'poll' then enqueue_member(member, waiter_lease, now) end
  return {0, soonest or 0, last}
end
if wait_mode == 'fair' and conflict_ahead() then
  enqueue_member(member, waiter_lease, now)
  return {2, 0, last}
end
local fence, field
if writer then
  fence, field = mint(last, now), 'w'
else
  -- The epoch: the last fence issued. With none (a new name, or a fence
  -- key lost in clock mode) one is minted, so that it is at least every
  -- fence a resource may already store.
  fence = tonumber(last) or mint(last, now)
  local n = 0
  while readers['r' .. n] do n = n + 1 end
  field = 'r' .. n
end
hold(field, fence)
return {1, fence, field}
