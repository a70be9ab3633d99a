-- Grant: set the lock and mint its fence in one atomic step (docs/design.md §2.1).
-- After common.lua and prelude.lua (KEYS and ARGV[1] are documented there).
local token = ARGV[2]          -- the caller's holder token
local ttl_ms = ARGV[3]         -- lease ttl in ms
local wait_mode = ARGV[4]      -- "poll", "notify" or "fair"
-- ARGV 5-7 only when the caller may queue (absent: it never queues):
local member = ARGV[5] or ''   -- the caller's queue member ("" = never queue)
local waiter_lease = tonumber(ARGV[6])  -- ms a queued waiter keeps its place
-- Whether an earlier attempt may have queued the caller. Each redis.call
-- costs about a microsecond: skip the dequeue when it was never queued (the
-- common, uncontended case).
local queued = member ~= '' and ARGV[7] == '1'
--
-- Returns the fence, a bare integer, when granted (a retry with the same
-- token gets the same grant back; an integer costs the client less to read
-- than an array), {0, pttl, last} when held by another, {2, 0, last} when free
-- but reserved for the head of a fair queue, where `last` is the fence stored
-- now (nil: none): a hand-over wake-up with a higher fence was made after
-- this attempt. Refused notify/fair callers are queued (or keep their place,
-- with a renewed waiter lease).

-- The common case (no fair queue to honour, never queued) sets the lock in
-- the same call that reads it: the fence is computed first (nothing is
-- written before SET), stored only if SET took the lock. Each redis.call
-- costs a few microseconds of Redis time: this path makes four (GET fence,
-- TIME, SET NX GET, SET fence), as few as a clock-fenced grant can.
local held, last, now
if wait_mode ~= 'fair' and not queued then
  last = last_fence()
  if FENCE_MODE == 'clock' then now = now_us() end
  local fence = next_fence(last, now)
  held = call('SET', LOCK, lock_value(token, fence), 'NX', 'PX', ttl_ms, 'GET')
  if not held then
    -- A lock must never stand without its fence stored: the next grant
    -- would mint the same counter fence, and a retry in the guide layout
    -- would read back an older one. SET NX found the key absent, so
    -- deleting it restores what was there.
    undo = LOCK
    store_fence(fence)
    return fence
  end
else
  held = call('GET', LOCK)
  last = last_fence()
end

-- A retry of a grant that already succeeded (or a lock handed over to this
-- waiter) gets the same fence back instead of minting another.
local mine = nil
if held and granted_to(held, token) then
  if FORMAT == 'tagged' then
    mine = tonumber(string.sub(held, #token + 2))
  else
    mine = tonumber(last)
  end
end

-- The queue keys are checked before the first write of any path that
-- touches them (none does on the uncontended path).
local queue_live = false
local touches_queue
if mine then
  touches_queue = queued
elseif held then
  touches_queue = member ~= '' and wait_mode ~= 'poll'
else
  touches_queue = queued or wait_mode == 'fair'
end
if touches_queue then queue_live = queue_exists(true) end

local function enqueue(now)
  enqueue_member(member, waiter_lease, now)
end

if mine then
  -- Restart the lease so it lasts ttl from this call, which the client
  -- measures from.
  call('PEXPIRE', LOCK, ttl_ms)
  if queued then dequeue(member) end
  return mine
end

if held then
  if wait_mode ~= 'poll' then enqueue(now or now_us()) end
  return {0, call('PTTL', LOCK), last}
end

now = now or now_us()
if wait_mode == 'fair' and queue_live then
  local head = live_head(math.floor(now / 1000))
  if head and head ~= member then
    enqueue(now)
    return {2, 0, last}
  end
end
local fence = mint(last, now)
call('SET', LOCK, lock_value(token, fence), 'PX', ttl_ms)
if queued then dequeue(member) end
return fence
