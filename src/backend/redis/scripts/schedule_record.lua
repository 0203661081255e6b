-- Applies changes to one schedule's record (baton's `backend::redis::schedules`).
-- KEYS: 1 summary hash, 2 hosts hash, 3 history hash (id -> entry JSON), 4 ticks zset
--       (id scored by tick ms), 5 digests set of the key.
-- ARGV: 1 digest, 2 spec JSON, 3 host, 4 history size N, 5 lifetime ms, 6 max hosts,
--       7.. one change JSON each: {tick, id, n?, attempt?, outcome?, note?}; an attempt's
--       start/end of -1 means "the server's now".
-- Returns the newest tick on record before this write (ms), or false.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev_last = redis.call('HGET', KEYS[1], 'last_tick_ms')

if redis.call('HEXISTS', KEYS[1], 'first_seen_ms') == 0 then
  redis.call('HSET', KEYS[1], 'first_seen_ms', now)
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'last_seen_ms', now)
redis.call('SADD', KEYS[5], ARGV[1])

-- The host, and at most ARGV[6] of them: the oldest seen goes.
redis.call('HSET', KEYS[2], ARGV[3], now)
local max_hosts = tonumber(ARGV[6])
while redis.call('HLEN', KEYS[2]) > max_hosts do
  local all = redis.call('HGETALL', KEYS[2])
  local oldest, oldest_ms = nil, nil
  for i = 1, #all, 2 do
    local ms = tonumber(all[i + 1]) or 0
    if oldest_ms == nil or ms < oldest_ms then oldest, oldest_ms = all[i], ms end
  end
  redis.call('HDEL', KEYS[2], oldest)
end

-- An occurrence's outcome only moves up this ladder; `running` and `failed` share a rung
-- (attempt 2 runs after attempt 1 failed), terminal outcomes are never overwritten by
-- anything but another terminal one.
local rank = {missed = 0, skipped_overlap = 1, skipped_paused = 1, running = 2, failed = 2,
  done = 3, exhausted = 3, replaced = 3}
local function rank_of(o) return rank[o] or 2 end

local newest_changed = nil
local success = nil
for i = 7, #ARGV do
  local c = cjson.decode(ARGV[i])
  local raw = redis.call('HGET', KEYS[3], c.id)
  local e = nil
  if raw then e = cjson.decode(raw) end
  local skip = (c.outcome == 'missed' and e ~= nil)
  if not skip then
    local fresh = (e == nil)
    if fresh then
      e = {tick = c.tick, id = c.id, outcome = c.outcome or 'running', attempts = {}}
    end
    if type(e.attempts) ~= 'table' then e.attempts = {} end
    local want = c.outcome
    local settle = false
    if c.n ~= nil and type(c.attempt) == 'table' then
      local key = tostring(c.n)
      local a = e.attempts[key]
      if type(a) ~= 'table' then a = {} end
      for k, v in pairs(c.attempt) do
        if (k == 'start' or k == 'end') and v == -1 then v = now end
        a[k] = v
      end
      e.attempts[key] = a
      -- The attempt's own outcome speaks for the occurrence only if no later attempt is on
      -- record (a late end of attempt 1 must not hide attempt 2's run).
      local latest = true
      for other, _ in pairs(e.attempts) do
        if (tonumber(other) or 0) > c.n then latest = false end
      end
      if want == nil and latest then
        -- An end that settles the occurrence (a buffered one whose window closed) speaks
        -- for it over its own `done`, and over the grant's `running` merged before or after.
        if type(a.settle) == 'string' then want = a.settle; settle = true
        elseif a.outcome == 'done' then want = 'done'
        elseif a.outcome == 'failed' or a.outcome == 'lost' then want = 'failed'
        else want = 'running' end
      end
      if a.outcome == 'done' and a.settle == nil then success = a['end'] or now end
    end
    if want ~= nil and (fresh or rank_of(want) >= rank_of(e.outcome)
        or (settle and rank_of(e.outcome) < 3)) then
      e.outcome = want
    end
    if c.note ~= nil then e.note = c.note end
    redis.call('HSET', KEYS[3], c.id, cjson.encode(e))
    redis.call('ZADD', KEYS[4], c.tick, c.id)
    if newest_changed == nil or c.tick > newest_changed then newest_changed = c.tick end
  end
end

-- The newest N ticks are kept.
local n = tonumber(ARGV[4])
local count = redis.call('ZCARD', KEYS[4])
if count > n then
  local old = redis.call('ZRANGE', KEYS[4], 0, count - n - 1)
  for _, id in ipairs(old) do redis.call('HDEL', KEYS[3], id) end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, count - n - 1)
end

-- The summary: newest tick and its outcome, newest success.
local top = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
if top[1] then
  redis.call('HSET', KEYS[1], 'last_tick_ms', top[2])
  local raw = redis.call('HGET', KEYS[3], top[1])
  if raw then
    local e = cjson.decode(raw)
    redis.call('HSET', KEYS[1], 'last_outcome', e.outcome)
  end
end
if success ~= nil then
  local old = tonumber(redis.call('HGET', KEYS[1], 'last_success_ms') or '0') or 0
  if success > old then redis.call('HSET', KEYS[1], 'last_success_ms', success) end
end

local life = tonumber(ARGV[5])
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], life) end
-- The digests' index is the key's, shared by every digest: only lengthened.
if redis.call('PTTL', KEYS[5]) < life then redis.call('PEXPIRE', KEYS[5], life) end
return prev_last
