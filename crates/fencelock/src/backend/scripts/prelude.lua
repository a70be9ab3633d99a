-- Shared by grant.lua, release.lua and leave.lua, and prepended to each: the
-- three scripts that change who holds a lock share fence minting and the
-- wait queue.
--
-- KEYS (all four share one hash slot in the default layout):
--   1 lock key (value TOKEN:FENCE, or TOKEN in the guide layout, PX ttl)
--   2 fence key (last fence issued)
--   3 wait queue: zset member -> arrival time in µs
--   4 waiter leases: zset member -> lease end in ms
-- Queue members are "CLIENT:WAITER:MODE:TTL_MS:HANDOVER_MS:TOKEN" (MODE
-- "fair" or "notify"): what a release needs to wake the waiter or hand it the
-- lock (for HANDOVER_MS, until the waiter renews it).
--
-- ARGV 1-3, the same in all three scripts: how fences are minted for this
-- name: the fence mode ("clock"/"counter"), the lock value format
-- ("tagged"/"bare") and the fence key retention in ms ("0" = forever).
--
-- Every read of the lock and fence keys happens before the first write, so a
-- key of the wrong type (or a fence key that is not a plain integer) is
-- refused before anything changes.

local LOCK, FENCE, QUEUE, WAITERS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FENCE_MODE, FORMAT, RETENTION = ARGV[1], ARGV[2], ARGV[3]

local MEMBER = '^([^:]+):([^:]+):(%a+):(%d+):(%d+):(.+)$'

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The fence key must hold a plain non-negative decimal integer, as fencelock
-- and the guide's INCR write it. tonumber() would accept '1.5', '0x10', ' 7',
-- '1e3', 'inf' and 'nan', and INCR accepts '-5'.
-- Returns the last fence (or nil) and an error reply if the key is unusable.
local function checked_last()
  local last = redis.pcall('GET', FENCE)
  if type(last) == 'table' and last.err then
    return nil, redis.error_reply(last.err)
  end
  if last and not string.match(last, '^%d+$') then
    return nil, redis.error_reply('ERR fence key ' .. FENCE .. ' does not hold an integer')
  end
  if last and tonumber(last) >= 9007199254740991 then
    -- Above 2^53 doubles cannot count by one: refuse rather than repeat.
    return nil, redis.error_reply('ERR fence key ' .. FENCE .. ' is at or above 2^53 - 1; fences cannot grow further')
  end
  return last, nil
end

-- Mints the next fence (DESIGN.md §2.1, §2.3).
local function mint(last, now)
  if FENCE_MODE == 'counter' then
    -- INCR keeps the key compatible with the guide's Python workers; a
    -- counter must never expire (a name once used in clock mode has a ttl).
    local f = redis.call('INCR', FENCE)
    redis.call('PERSIST', FENCE)
    return f
  end
  -- Floor the fence at the server clock in µs: if the fence key is lost
  -- (restart without persistence, failover, eviction, expiry) the next fence
  -- is still above every fence issued before, as long as the server clock
  -- does not step back. Values stay below 2^53, exact in Lua doubles.
  local f = math.max((tonumber(last) or 0) + 1, now)
  -- string.format('%d') because tostring() rounds 16-digit numbers (%.14g).
  if RETENTION ~= '0' then
    redis.call('SET', FENCE, string.format('%d', f), 'PX', RETENTION)
  else
    redis.call('SET', FENCE, string.format('%d', f))
  end
  return f
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

local function dequeue(member)
  redis.call('ZREM', QUEUE, member)
  redis.call('ZREM', WAITERS, member)
end

-- The first queued waiter whose lease has not ended, and its arrival time in
-- µs; dead ones are dropped.
local function live_head(now_ms)
  for _ = 1, 64 do
    local first = redis.call('ZRANGE', QUEUE, 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then return nil end
    local lease_end = tonumber(redis.call('ZSCORE', WAITERS, head))
    if lease_end and lease_end > now_ms then return head, tonumber(first[2]) end
    dequeue(head)
  end
  return nil
end

-- After the lock became free: hand it to the head waiter (a fair one, or a
-- notify one that has waited `starving_us`) or wake it (a notify one). One
-- message to one waiter per call: the Redis work does not grow with the
-- number of waiters. The fence key is read only when there is a waiter to
-- hand over to; if it is unusable the head is only woken, and its own grant
-- attempt reports the problem.
local function pass_on(wake_prefix, publish, starving_us)
  if redis.call('EXISTS', QUEUE) == 0 then return end
  local last, err = checked_last()
  if err then last = false end
  local now = now_us()
  local head, arrived = live_head(math.floor(now / 1000))
  if not head then return end
  local client, waiter, wmode, ttl, handover, token = string.match(head, MEMBER)
  local hand = token and last ~= false
    and (wmode == 'fair' or now - arrived >= starving_us)
  if not hand then
    client, waiter = string.match(head, '^([^:]+):([^:]+)')
    -- pcall: a wake-up is best effort (waiters retry on their own), and a
    -- user without channel permission must still be able to release.
    if client then redis.pcall(publish, wake_prefix .. client, waiter) end
    return
  end
  -- Hand over: mint the fence and grant in this same script. Until the new
  -- holder renews (at once), the lease lasts only its hand-over lease (its
  -- waiter lease in fair mode, at most 100 ms in notify mode), so a waiter
  -- that vanished cannot keep the lock for a whole ttl.
  local fence = mint(last, now)
  local px = math.min(tonumber(ttl), tonumber(handover))
  redis.call('SET', LOCK, lock_value(token, fence), 'PX', px)
  dequeue(head)
  redis.pcall(publish, wake_prefix .. client, waiter .. ' ' .. string.format('%d', fence))
end
