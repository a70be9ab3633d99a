-- Grant, release and leave: the three operations that change who holds a
-- lock, in one script so they share the fence minting and the wait queue.
--
-- KEYS (all four share one hash slot in the default layout):
--   KEYS[1] lock key (value TOKEN:FENCE, or TOKEN in the guide layout, PX ttl)
--   KEYS[2] fence key (last fence issued)
--   KEYS[3] wait queue: zset member -> arrival time in µs
--   KEYS[4] waiter leases: zset member -> lease end in ms
-- Queue members: "CLIENT:WAITER:MODE:TTL_MS:HANDOVER_MS:TOKEN", MODE "fair"
-- or "notify": what a release needs to wake the waiter or hand it the lock
-- (for HANDOVER_MS, until the waiter renews it). The queue score is the
-- waiter's arrival time in µs.
--
-- ARGV[1] is the operation; the others depend on it (see each branch).
-- Common to all: the fence mode ("clock"/"counter"), the lock value format
-- ("tagged"/"bare"), the fence key retention in ms ("0" = forever), the wake
-- channel prefix and the publish command ("PUBLISH"/"SPUBLISH").
--
-- Every read of the lock and fence keys happens before the first write, so a
-- key of the wrong type (or a fence key that is not a plain integer) is
-- refused before anything changes.

local op = ARGV[1]

-- A notify waiter that has waited this long (µs since it queued) is handed
-- the lock at the next release, as a fair waiter always is: workers may
-- barge in ahead of a waiter, but never starve it (the starvation mode of
-- Go's sync.Mutex).
local STARVING_US = 10000

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
  local last = redis.pcall('GET', KEYS[2])
  if type(last) == 'table' and last.err then
    return nil, redis.error_reply(last.err)
  end
  if last and not string.match(last, '^%d+$') then
    return nil, redis.error_reply('ERR fence key ' .. KEYS[2] .. ' does not hold an integer')
  end
  if last and tonumber(last) >= 9007199254740991 then
    -- Above 2^53 doubles cannot count by one: refuse rather than repeat.
    return nil, redis.error_reply('ERR fence key ' .. KEYS[2] .. ' is at or above 2^53 - 1; fences cannot grow further')
  end
  return last, nil
end

-- Mints the next fence (DESIGN.md §2.1, §2.3).
local function mint(mode, last, retention, now)
  if mode == 'counter' then
    -- INCR keeps the key compatible with the guide's Python workers; a
    -- counter must never expire (a name once used in clock mode has a ttl).
    local f = redis.call('INCR', KEYS[2])
    redis.call('PERSIST', KEYS[2])
    return f
  end
  -- Floor the fence at the server clock in µs: if the fence key is lost
  -- (restart without persistence, failover, eviction, expiry) the next fence
  -- is still above every fence issued before, as long as the server clock
  -- does not step back. Values stay below 2^53, exact in Lua doubles.
  local f = math.max((tonumber(last) or 0) + 1, now)
  -- string.format('%d') because tostring() rounds 16-digit numbers (%.14g).
  if retention ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', f), 'PX', retention)
  else
    redis.call('SET', KEYS[2], string.format('%d', f))
  end
  return f
end

local function lock_value(token, fence, format)
  if format == 'tagged' then
    return token .. ':' .. string.format('%d', fence)
  end
  return token
end

local function dequeue(member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end

-- The first queued waiter whose lease has not ended, and its arrival time in
-- µs; dead ones are dropped.
local function live_head(now_ms)
  for _ = 1, 64 do
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then return nil end
    local lease_end = tonumber(redis.call('ZSCORE', KEYS[4], head))
    if lease_end and lease_end > now_ms then return head, tonumber(first[2]) end
    dequeue(head)
  end
  return nil
end

-- After the lock became free: hand it to the head waiter (a fair one, or a
-- notify one that is starving) or wake it (a notify one). One message to one
-- waiter per call: the Redis work does not grow with the number of waiters.
-- The fence key is read only when there is a waiter to hand over to; if it
-- is unusable the head is only woken, and its own grant attempt reports the
-- problem.
local function pass_on(mode, format, retention, prefix, publish)
  if redis.call('EXISTS', KEYS[3]) == 0 then return end
  local last, err = checked_last()
  if err then last = false end
  local now = now_us()
  local head, arrived = live_head(math.floor(now / 1000))
  if not head then return end
  local client, waiter, wmode, ttl, handover, token = string.match(head, MEMBER)
  local hand = token and last ~= false
    and (wmode == 'fair' or now - arrived >= STARVING_US)
  if not hand then
    client, waiter = string.match(head, '^([^:]+):([^:]+)')
    -- pcall: a wake-up is best effort (waiters retry on their own), and a
    -- user without channel permission must still be able to release.
    if client then redis.pcall(publish, prefix .. client, waiter) end
    return
  end
  -- Hand over: mint the fence and grant in this same script. Until the new
  -- holder renews (at once), the lease lasts only its hand-over lease (its
  -- waiter lease in fair mode, at most 100 ms in notify mode), so a waiter
  -- that vanished cannot keep the lock for a whole ttl.
  local fence = mint(mode, last, retention, now)
  local px = math.min(tonumber(ttl), tonumber(handover))
  redis.call('SET', KEYS[1], lock_value(token, fence, format), 'PX', px)
  dequeue(head)
  redis.pcall(publish, prefix .. client, waiter .. ' ' .. string.format('%d', fence))
end

if op == 'grant' then
  -- ARGV: 2 token, 3 ttl ms, 4 fence mode, 5 value format, 6 retention,
  -- 7 wait mode ("poll"/"notify"/"fair"), 8 member ("" = never queue),
  -- 9 waiter lease ms, 10 "1" if an earlier attempt may have queued it.
  -- Returns {1, fence} when granted (a retry with the same token gets the
  -- same grant back), {0, pttl} when held by another, {0, -3} when free but
  -- reserved for the head of a fair queue. Refused notify/fair callers are
  -- queued (or keep their place, with a renewed waiter lease).
  local token, ttl, wait_mode, member = ARGV[2], ARGV[3], ARGV[7], ARGV[8]
  -- Each redis.call costs about a microsecond: skip the dequeue when this
  -- caller was never queued (the common, uncontended case).
  local queued = member ~= '' and ARGV[10] == '1'
  local held = redis.call('GET', KEYS[1])
  local last, err = checked_last()
  if err then return err end

  local function enqueue(now)
    if member == '' then return end
    local wlease = tonumber(ARGV[9])
    if not redis.call('ZSCORE', KEYS[3], member) then
      redis.call('ZADD', KEYS[3], now, member)
    end
    redis.call('ZADD', KEYS[4], math.floor(now / 1000) + wlease, member)
    -- Only ever extend: a waiter with a short lease must not shorten the
    -- queue under waiters with longer ones.
    local keep = wlease * 2
    if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], keep) end
    if redis.call('PTTL', KEYS[4]) < keep then redis.call('PEXPIRE', KEYS[4], keep) end
  end

  if held then
    -- A retry of a grant that already succeeded (or a lock handed over to
    -- this waiter): return the same fence instead of minting another, and
    -- restart the lease so it lasts ttl from this call, which the client
    -- measures from.
    local mine = nil
    if ARGV[5] == 'tagged' then
      local prefix = token .. ':'
      if string.sub(held, 1, #prefix) == prefix then
        mine = tonumber(string.sub(held, #prefix + 1))
      end
    elseif held == token and last then
      mine = tonumber(last)
    end
    if mine then
      redis.call('PEXPIRE', KEYS[1], ttl)
      if queued then dequeue(member) end
      return {1, mine}
    end
    if wait_mode ~= 'poll' then enqueue(now_us()) end
    return {0, redis.call('PTTL', KEYS[1])}
  end

  local now = now_us()
  if wait_mode == 'fair' and redis.call('EXISTS', KEYS[3]) == 1 then
    local head = live_head(math.floor(now / 1000))
    if head and head ~= member then
      enqueue(now)
      return {0, -3}
    end
  end
  local fence = mint(ARGV[4], last, ARGV[6], now)
  redis.call('SET', KEYS[1], lock_value(token, fence, ARGV[5]), 'PX', ttl)
  if queued then dequeue(member) end
  return {1, fence}
end

if op == 'release' then
  -- Compare-and-delete (DESIGN.md §2.2), then pass the lock on.
  -- ARGV: 2 the exact lock value granted, 3 fence mode, 4 value format,
  -- 5 retention, 6 wake prefix, 7 publish command.
  -- Returns 1 when released, 0 when absent (expired), -1 when another holds
  -- it. Never touches another holder's lock.
  local v = redis.call('GET', KEYS[1])
  if v ~= ARGV[2] then
    if v then return -1 end
    return 0
  end
  redis.call('DEL', KEYS[1])
  pass_on(ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  return 1
end

if op == 'leave' then
  -- A waiter leaves the queue (it gave up or was cancelled). If the lock was
  -- handed to it meanwhile, it is released; if the lock is free, it is passed
  -- on, so nobody waits for a waiter that is gone.
  -- ARGV: 2 member, 3 token, 4 fence mode, 5 value format, 6 retention,
  -- 7 wake prefix, 8 publish command.
  -- Returns 2 if a lock handed to this waiter was released, 1 if it was
  -- queued, 0 otherwise.
  local v = redis.call('GET', KEYS[1])
  local removed = redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
  local prefix = ARGV[3] .. ':'
  local handed = v and (v == ARGV[3] or string.sub(v, 1, #prefix) == prefix)
  if handed then
    redis.call('DEL', KEYS[1])
    removed = 2
  end
  if handed or not v then
    pass_on(ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
  end
  return removed
end

return redis.error_reply('ERR unknown fencelock operation ' .. tostring(op))
