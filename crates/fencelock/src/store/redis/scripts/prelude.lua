-- Shared by grant.lua, release.lua and leave.lua (after fence_clock.lua,
-- whose clock_fence and MINT_* it uses, fast_helpers.lua and common.lua): the
-- three scripts that change who holds a lock share fence minting and the
-- wait queue.
--
-- KEYS[1] is the lock key (value TOKEN:FENCE, or TOKEN in the guide layout,
-- PX ttl); the lock's other keys are it and a suffix (LockKeys), so they
-- share its hash slot in the default layout and are not passed (every
-- argument costs Redis time):
--   LOCK:fence    the last fence issued
--   LOCK:queue    wait queue: zset member -> arrival time in µs
--   LOCK:waiters  waiter leases: zset member -> lease end in ms
-- A release wakes a waiter on the channel LOCK:wake:CLIENT.
-- Queue members are "CLIENT:WAITER:MODE:TTL_MS:HANDOVER_MS:TOKEN" (MODE
-- "fair" or "notify"; a read-write lock's waiter puts "r" or "w" before
-- it): what a release needs to wake the waiter or hand it the
-- lock (for HANDOVER_MS, until the waiter renews it).
--
-- ARGV[1], the same in all three scripts: how fences are minted for this
-- name, in one argument (each argument costs Redis time): the fence mode
-- ("c" clock, "n" counter), the lock value format ("t" tagged TOKEN:FENCE,
-- "b" bare TOKEN) and the fence key retention in ms ("0" = forever), e.g.
-- "ct86400000". A script that passes the lock on reads more after it, from
-- a space on (release.lua).

local LOCK = KEYS[1]
local FENCE, QUEUE, WAITERS = LOCK .. ':fence', LOCK .. ':queue', LOCK .. ':waiters'
local FENCE_MODE = string.byte(ARGV[1], 1) == MINT_CLOCK and 'clock' or 'counter'
local FORMAT = string.byte(ARGV[1], 2) == MINT_TAGGED and 'tagged' or 'bare'
local RETENTION = string.match(ARGV[1], '^..(%d+)')

local MEMBER = '^([^:]+):([^:]+):(%a+):(%d+):(%d+):(.+)$'

local function now_us()
  local t = call('TIME')
  return t[1] * 1000000 + t[2]
end

-- The last fence issued (nil if none). The fence key must hold a canonical
-- non-negative decimal integer, as fencelock and the guide's INCR write it:
-- tonumber() would accept '1.5', '0x10', ' 7', '1e3', 'inf' and 'nan', INCR
-- accepts '-5', and INCR refuses '007'.
local function last_fence()
  local last = call('GET', FENCE)
  if last and not (string.match(last, '^[1-9]%d*$') or last == '0') then
    fail('FLBADFENCE ' .. FENCE)
  end
  if last and (#last > 16 or tonumber(last) >= 9007199254740991) then
    -- Above 2^53 doubles cannot count by one: refuse rather than repeat.
    fail('FLFENCEMAX ' .. FENCE)
  end
  return last
end

-- The next fence after LAST at server time NOW (µs), not yet stored
-- (docs/design.md §2.1, §2.3).
local function next_fence(last, now)
  if FENCE_MODE == 'counter' then
    -- As INCR counts: 1 after none.
    return (tonumber(last) or 0) + 1
  end
  return clock_fence(tonumber(last) or 0, now)
end

-- Stores FENCE, minted by next_fence, as the last fence issued.
local function store_fence(f)
  -- string.format('%d') because tostring() rounds 16-digit numbers (%.14g).
  if FENCE_MODE == 'counter' then
    -- INCR keeps the key compatible with the guide's Python workers (and
    -- gives F: LAST was read in this same script); a counter must never
    -- expire (a name once used in clock mode has a ttl).
    call('INCR', FENCE)
    call('PERSIST', FENCE)
  elseif RETENTION ~= '0' then
    call('SET', FENCE, string.format('%d', f), 'PX', RETENTION)
  else
    call('SET', FENCE, string.format('%d', f))
  end
  return f
end

-- Mints and stores the next fence.
local function mint(last, now)
  return store_fence(next_fence(last, now))
end

local function lock_value(token, fence)
  if FORMAT == 'tagged' then
    return token .. ':' .. string.format('%d', fence)
  end
  return token
end

-- Whether lock value `held` was granted to `token`.
local function granted_to(held, token)
  if FORMAT == 'tagged' then
    local prefix = token .. ':'
    return string.sub(held, 1, #prefix) == prefix
  end
  return held == token
end

-- Whether the wait queue exists. Fails if it holds another type, or the
-- waiter leases do (checked when the queue exists, or `always`, for a
-- caller about to write them).
local function queue_exists(always)
  local live = check_type(QUEUE, 'zset')
  if live or always then check_type(WAITERS, 'zset') end
  return live
end

local function dequeue(member)
  call('ZREM', QUEUE, member)
  call('ZREM', WAITERS, member)
end

-- Queues MEMBER ("" = never) arriving at NOW (µs), or keeps its place, with
-- its waiter lease renewed to WAITER_LEASE ms from now.
local function enqueue_member(member, waiter_lease, now)
  if member == '' then return end
  if not call('ZSCORE', QUEUE, member) then
    call('ZADD', QUEUE, now, member)
  end
  call('ZADD', WAITERS, math.floor(now / 1000) + waiter_lease, member)
  -- Only ever extend: a waiter with a short lease must not shorten the
  -- queue under waiters with longer ones.
  local keep = waiter_lease * 2
  if call('PTTL', QUEUE) < keep then call('PEXPIRE', QUEUE, keep) end
  if call('PTTL', WAITERS) < keep then call('PEXPIRE', WAITERS, keep) end
end

-- Whether queue member ENTRY waits to write a read-write lock (its MODE is
-- the access and the wait mode: "wfair", "wnotify"; rw_grant.lua).
local function waits_to_write(entry)
  return string.match(entry, '^[^:]+:[^:]+:w') ~= nil
end

-- The first queued waiter whose lease has not ended, and its arrival time in
-- µs; dead ones are dropped.
local function live_head(now_ms)
  for _ = 1, 64 do
    local first = call('ZRANGE', QUEUE, 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then return nil end
    local lease_end = tonumber(call('ZSCORE', WAITERS, head))
    if lease_end and lease_end > now_ms then return head, tonumber(first[2]) end
    dequeue(head)
  end
  return nil
end

-- The first N queued waiters whose leases have not ended, in queue order;
-- dead ones met on the way are dropped (at most 64 per call).
local function live_heads(n, now_ms)
  local heads, index, dropped = {}, 0, 0
  while #heads < n and dropped < 64 do
    local entry = call('ZRANGE', QUEUE, index, index)[1]
    if not entry then break end
    local lease_end = tonumber(call('ZSCORE', WAITERS, entry))
    if lease_end and lease_end > now_ms then
      heads[#heads + 1] = entry
      index = index + 1
    else
      dequeue(entry)
      dropped = dropped + 1
    end
  end
  return heads
end

-- After the lock became free, with a queue (its keys checked): hand the lock
-- to the head waiter (a fair one, or a notify one that has waited
-- `starving_us`) or wake it (a notify one). One message to one waiter per
-- call: the Redis work does not grow with the number of waiters. If the
-- fence key is unusable (or may not be written) the head is only woken, and
-- its own grant attempt reports the problem.
local function pass_on(wake_prefix, publish, starving_us)
  local usable, last = pcall(last_fence)
  local now = now_us()
  local head, arrived = live_head(math.floor(now / 1000))
  if not head then return end
  local client, waiter, wmode, ttl, handover, token = string.match(head, MEMBER)
  -- Only a mutex's waiter is handed the lock ("fair", or a starving
  -- "notify"): a read-write lock's waiter ("rfair", "wnotify") is woken.
  local hand = token and usable
    and (wmode == 'fair' or (wmode == 'notify' and now - arrived >= starving_us))
  local fence
  if hand then
    -- Mint the fence first: if it cannot be stored (an ACL that lets the
    -- user write the lock key only), the head is only woken, and the lock
    -- this call deleted stays released.
    hand, fence = pcall(mint, last, now)
  end
  if not hand then
    client, waiter = string.match(head, '^([^:]+):([^:]+)')
    -- pcall: a wake-up is best effort (waiters retry on their own), and a
    -- user without channel permission must still be able to release.
    if client then redis.pcall(publish, wake_prefix .. client, waiter) end
    return
  end
  -- Hand over: the fence is minted, grant in this same script. Until the new
  -- holder renews (at once), the lease lasts only its hand-over lease (its
  -- waiter lease in fair mode, at most 100 ms in notify mode), so a waiter
  -- that vanished cannot keep the lock for a whole ttl.
  local px = math.min(tonumber(ttl), tonumber(handover))
  call('SET', LOCK, lock_value(token, fence), 'PX', px)
  dequeue(head)
  redis.pcall(publish, wake_prefix .. client, waiter .. ' ' .. string.format('%d', fence))
end
