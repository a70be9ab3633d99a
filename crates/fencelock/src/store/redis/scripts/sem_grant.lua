-- Semaphore grant: take a free slot of N and mint its fence in one atomic
-- step. After common.lua and prelude.lua (ARGV[1], the fence key and the
-- wait queue are documented there; the queue and its members are the
-- mutex's).
--
-- KEYS[1], the semaphore key, is a hash where the mutex has a string: the
-- field `permits` holds N, and field SLOT ("0" to "N-1") holds its permit
-- as "TOKEN:FENCE:DEADLINE", DEADLINE the server time in ms when it lapses.
-- Redis 7.0 cannot expire a hash field, so a permit past its DEADLINE
-- counts as free in every script, and the key itself expires with its
-- latest permit. A name is one kind: a mutex's SET meets this hash and
-- fails (WRONGTYPE), this script refuses a string, and a read-write lock's
-- hash (rw_grant.lua) is told by its `rw` field.
local token = ARGV[2]                  -- the caller's holder token
local ttl_ms = tonumber(ARGV[3])       -- lease ttl in ms
local wait_mode = ARGV[4]              -- "poll", "notify" or "fair"
local permits = tonumber(ARGV[5])      -- N, 1 to 1024
local member = ARGV[6] or ''           -- the caller's queue member ("" = never queue)
local waiter_lease = tonumber(ARGV[7]) -- ms a queued waiter keeps its place
local queued = member ~= '' and ARGV[8] == '1'
--
-- Returns {1, fence, slot} when granted (a retry by a token that holds a
-- slot gets that slot and fence back, its lease restarted), {0, ms, last}
-- when every slot is held (ms: the soonest a permit lapses), {2, 0, last}
-- when a free slot is reserved for the fair queue's first waiters, where
-- `last` is the fence stored now (nil: none); {3, 0} when the name is held
-- as a mutex, {4, n} when it has holders under another permit count n,
-- {5, 0} when it has holders as a read-write lock.
-- Refused notify/fair callers are queued (or keep their place).

local kind = call('TYPE', LOCK)['ok']
if kind == 'string' then return {3, 0} end
if kind ~= 'none' and kind ~= 'hash' then fail('FLWRONGTYPE ' .. kind .. ' ' .. LOCK) end
if member ~= '' or wait_mode == 'fair' then queue_exists(true) end
local last = last_fence()

local now = now_us()
local now_ms = math.floor(now / 1000)
local held, live, soonest = {}, 0, nil
local stored_permits, mine_slot, mine_fence = nil, nil, nil
local lapsed, rw = {}, false
local fields = call('HGETALL', LOCK)
for i = 1, #fields, 2 do
  local field, value = fields[i], fields[i + 1]
  if field == 'permits' then
    stored_permits = tonumber(value)
  elseif field == 'rw' then
    -- A read-write lock's mark (rw_grant.lua): it goes with its last holder.
    rw = true
    lapsed[#lapsed + 1] = field
  else
    local who, fence, deadline = string.match(value, '^(.-):(%d+):(%d+)$')
    deadline = tonumber(deadline)
    if deadline and deadline > now_ms then
      held[field] = true
      live = live + 1
      if not soonest or deadline - now_ms < soonest then soonest = deadline - now_ms end
      if who == token then mine_slot, mine_fence = field, tonumber(fence) end
    else
      lapsed[#lapsed + 1] = field
    end
  end
end

-- Holds SLOT with FENCE until ttl from now; the key lives as long as its
-- latest permit.
local function hold(slot, fence)
  call('HSET', LOCK, slot, token .. ':' .. string.format('%d', fence) .. ':'
    .. string.format('%d', now_ms + ttl_ms), 'permits', permits)
  if call('PTTL', LOCK) < ttl_ms then call('PEXPIRE', LOCK, ttl_ms) end
  if queued then dequeue(member) end
end

if rw and live > 0 then return {5, 0} end
if mine_slot then
  hold(mine_slot, mine_fence)
  return {1, mine_fence, tonumber(mine_slot)}
end
if live > 0 and stored_permits ~= permits then
  return {4, stored_permits or 0}
end
-- Past every refusal that says nothing was changed: lapsed permits go.
if #lapsed > 0 then call('HDEL', LOCK, unpack(lapsed)) end
local free = permits - live
if free <= 0 then
  if wait_mode ~= 'poll' then enqueue_member(member, waiter_lease, now) end
  return {0, soonest or 0, last}
end
if wait_mode == 'fair' then
  -- FIFO across permits: the free slots are the first live waiters'. A
  -- caller among them (or any caller, when fewer wait) takes one.
  local heads = live_heads(free, now_ms)
  if #heads >= free then
    local first = false
    for _, head in ipairs(heads) do
      if head == member then first = true end
    end
    if not first then
      enqueue_member(member, waiter_lease, now)
      return {2, 0, last}
    end
  end
end
local slot = 0
while held[tostring(slot)] do slot = slot + 1 end
local fence = mint(last, now)
hold(tostring(slot), fence)
return {1, fence, slot}
