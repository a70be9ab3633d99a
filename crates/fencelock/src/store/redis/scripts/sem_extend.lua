-- Renewal of semaphore permits, one or many in one call (the keeper's
-- batch). After common.lua. KEYS[i]: the semaphore key of permit i (a key
-- may repeat; on a Cluster all of one slot); ARGV[1]: the new ttl in ms;
-- ARGV[2i], ARGV[2i + 1]: permit i's slot and "TOKEN:FENCE".
--
-- Returns the permits it did not extend as a flat list of pairs {i, code}
-- (extend_many.lua's reply): code 0 when the slot's permit lapsed or is
-- gone, -1 when another holder's live permit (or another type) is there. Never revives a lapsed permit, never touches another holder's,
-- and never changes a fence.

local ttl_ms = tonumber(ARGV[1])
local t = call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local slot, ident = ARGV[2 * i], ARGV[2 * i + 1]
  local held = redis.pcall('HGET', key, slot)
  local code = 0
  if type(held) == 'table' then
    -- Another type (a mutex took the name) is another holder's; any other
    -- error (an ACL) is raised again through call(), which names it.
    if string.sub(held.err, 1, 9) ~= 'WRONGTYPE' then call('HGET', key, slot) end
    code = -1
  elseif held then
    -- A lapsed permit is gone whoever held it (0, as sem_release.lua).
    local who, deadline = string.match(held, '^(.*):(%d+)$')
    if not deadline or tonumber(deadline) <= now_ms then
      code = 0
    elseif who ~= ident then
      code = -1
    else
      call('HSET', key, slot, ident .. ':' .. string.format('%d', now_ms + ttl_ms))
      if call('PTTL', key) < ttl_ms then call('PEXPIRE', key, ttl_ms) end
      code = 1
    end
  end
  if code ~= 1 then
    out[#out + 1] = i
    out[#out + 1] = code
  end
end
return out
