"""Lua scripts of the Redis store: each operation is one atomic round trip.

Every script gets KEYS[1] = the namespace's "lru" key (so Redis Cluster routes it to the
namespace's slot) and ARGV[1..4] = key base, now, native expiry in ms, TTL cutoff. All keys
a script touches share the namespace's hash tag, so they live in the same slot.
The in-memory store (memory_store.py) implements the same algorithm.

Under a ``maxmemory`` eviction policy Redis may drop any of a namespace's keys between
calls: a listed id whose metadata is gone is taken off the lists, and a stats hash that is
gone is rebuilt from the documents (byte counts and the next document number). Under
``noeviction`` a full Redis refuses a script's first write, before it changed anything.
"""

from __future__ import annotations

from lookup.corpus.anchors import INDEX_ANCHOR_BYTES, INDEX_DOC_BYTES, MAX_POSTINGS
from lookup.corpus.store import PURGE_BATCH, RETRIEVE_SCAN

_PRELUDE = (
    """
local B, NOW, EXPIRE_MS, CUTOFF = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local K_LRU, K_ANS, K_DOCS, K_NAMES = B .. 'lru', B .. 'ans', B .. 'docs', B .. 'names'
local K_REFS, K_STAT, K_FPS = B .. 'refs', B .. 'stat', B .. 'fps'
local K_AX, K_AD, K_AN, K_CAP, K_AKEY = B .. 'ax', B .. 'ad', B .. 'an', B .. 'cap', B .. 'akey'
"""
    + f"local MAX_POSTINGS, ANCHOR_COST, DOC_COST = {MAX_POSTINGS}, {INDEX_ANCHOR_BYTES}, "
    + f"{INDEX_DOC_BYTES}\n"
    + f"local PURGE_BATCH, RETRIEVE_SCAN = {PURGE_BATCH}, {RETRIEVE_SCAN}\n"
    + """-- commands over many fields, in slices that stay within Lua's stack
local function hmget(key, fields)
  local out = {}
  for s = 1, #fields, 1000 do
    local got = redis.call('HMGET', key, unpack(fields, s, math.min(s + 999, #fields)))
    for _, v in ipairs(got) do out[#out + 1] = v end
  end
  return out
end

local function hmulti(cmd, key, args)
  for s = 1, #args, 1000 do
    redis.call(cmd, key, unpack(args, s, math.min(s + 999, #args)))
  end
end

local function split(packed)
  local fields = {}
  for i = 1, #packed, 6 do fields[#fields + 1] = string.sub(packed, i, i + 5) end
  return fields
end

-- retrieval index: K_AX anchor (6 bytes) -> postings (4-byte document numbers, at most
-- MAX_POSTINGS), so an anchor's work is bounded whatever else the namespace holds
local function index_add(idh, num, packed)
  local fields = split(packed)
  if #fields == 0 then return end
  local lists, kept, writes = hmget(K_AX, fields), {}, {}
  for j, anchor in ipairs(fields) do
    local list = lists[j] or ''
    if #list < MAX_POSTINGS * 4 then
      writes[#writes + 1] = anchor
      writes[#writes + 1] = list .. num
      kept[#kept + 1] = anchor
    end
  end
  if #kept == 0 then return end
  hmulti('HSET', K_AX, writes)
  redis.call('HSET', K_AD, idh, table.concat(kept))
  redis.call('HSET', K_AN, num, idh)
  redis.call('HINCRBY', K_STAT, 'axbytes', #kept * ANCHOR_COST + DOC_COST)
  return #kept * ANCHOR_COST + DOC_COST
end

local function index_drop(idh, meta)
  local packed = redis.call('HGET', K_AD, idh)
  if not packed or not meta.num then return 0 end
  local num = struct.pack('>I4', meta.num)
  local fields = split(packed)
  local lists, writes, gone = hmget(K_AX, fields), {}, {}
  for j, anchor in ipairs(fields) do
    local list = lists[j] or ''
    for i = 1, #list, 4 do
      if string.sub(list, i, i + 3) == num then
        list = string.sub(list, 1, i - 1) .. string.sub(list, i + 4)
        break
      end
    end
    if #list == 0 then
      gone[#gone + 1] = anchor
    else
      writes[#writes + 1] = anchor
      writes[#writes + 1] = list
    end
  end
  hmulti('HSET', K_AX, writes)
  hmulti('HDEL', K_AX, gone)
  redis.call('HDEL', K_AD, idh)
  redis.call('HDEL', K_AN, num)
  local cost = #fields * ANCHOR_COST + DOC_COST
  redis.call('HINCRBY', K_STAT, 'axbytes', -cost)
  return cost
end

-- bytes of the namespace (all) and of its captured documents
local function stored_bytes()
  local s = redis.call('HMGET', K_STAT, 'bytes', 'axbytes', 'cbytes')
  return tonumber(s[1] or '0') + tonumber(s[2] or '0'), tonumber(s[3] or '0')
end

-- a captured document's own bytes (its index entry's are added as it is indexed)
local function captured_cost(meta)
  return meta.bytes + (meta.meta_bytes or 0)
end

-- the stats hash, rebuilt from the documents when Redis evicted it
local function stats()
  if redis.call('EXISTS', K_STAT) == 1 then return end
  local bytes, ix, cbytes, seq, seen = 0, 0, 0, 0, {}
  local docs = redis.call('HGETALL', K_DOCS)
  for i = 1, #docs, 2 do
    local meta = cjson.decode(docs[i + 1])
    local packed = redis.call('HGET', K_AD, docs[i])
    local cost = packed and (#packed / 6 * ANCHOR_COST + DOC_COST) or 0
    bytes = bytes + (meta.meta_bytes or 0)
    if not seen[meta.sha256] then seen[meta.sha256] = true; bytes = bytes + meta.bytes end
    ix = ix + cost
    if meta.captured then cbytes = cbytes + captured_cost(meta) + cost end
    if meta.num and meta.num > seq then seq = meta.num end
  end
  if #docs > 0 then
    redis.call('HSET', K_STAT, 'bytes', bytes, 'axbytes', ix, 'cbytes', cbytes, 'seq', seq)
  end
end
"""
    + """
local function drop_ref(sha, size)
  if redis.call('HINCRBY', K_REFS, sha, -1) <= 0 then
    redis.call('HDEL', K_REFS, sha)
    redis.call('DEL', B .. 'b:' .. sha)
    redis.call('HINCRBY', K_STAT, 'bytes', 0 - size)
    for _, fp in ipairs(redis.call('SMEMBERS', K_FPS)) do
      redis.call('DEL', B .. 't:' .. fp .. ':' .. sha)
    end
  end
end

local function drop_names(idh, meta)
  for _, n in ipairs(meta.names) do
    if redis.call('HGET', K_NAMES, n) == idh then redis.call('HDEL', K_NAMES, n) end
  end
end

-- takes idh off every list even when its metadata is gone (evicted by Redis); returns
-- whether anything was removed
local function remove(idh)
  local listed = redis.call('ZREM', K_LRU, idh) + redis.call('ZREM', K_ANS, idh)
    + redis.call('ZREM', K_CAP, idh)
  local raw = redis.call('HGET', K_DOCS, idh)
  if not raw then return listed > 0 end
  local meta = cjson.decode(raw)
  redis.call('HDEL', K_DOCS, idh)
  drop_names(idh, meta)
  local cost = index_drop(idh, meta)
  drop_ref(meta.sha256, meta.bytes)
  redis.call('HINCRBY', K_STAT, 'bytes', 0 - (meta.meta_bytes or 0))
  if meta.captured then
    redis.call('HINCRBY', K_STAT, 'cbytes', -(captured_cost(meta) + cost))
  end
  return true
end

-- the oldest PURGE_BATCH documents unused since CUTOFF go; the others are skipped as gone
-- until a later call purges them, so no call's work grows with how many expired at once
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', K_LRU, '-inf', '(' .. CUTOFF, 'LIMIT', 0, PURGE_BATCH)
  for _, idh in ipairs(expired) do
    remove(idh)
  end
end

local function live(idh)
  local used = redis.call('ZSCORE', K_LRU, idh)
  return used ~= false and tonumber(used) >= tonumber(CUTOFF)
end

local function keep_alive()
  for _, k in ipairs({K_LRU, K_ANS, K_CAP, K_DOCS, K_NAMES, K_REFS, K_STAT, K_FPS, K_AX, K_AD,
                      K_AN, K_AKEY}) do
    redis.call('PEXPIRE', k, EXPIRE_MS)
  end
end
"""
)

# ARGV[5..]: id hash, metadata JSON (names = name hashes), text, answer flag, max docs,
# max bytes, packed anchors (6 bytes each), captured flag, max captured docs, max captured
# bytes, the anchor key they were computed with ("" when not known). Uploaded and captured
# documents have caps of their own: each evicts its own kind's least recently used, never
# the other's. An anchor key Redis evicted is put back from the one the anchors were
# computed with, so the documents stored before it stay findable by content.
PUT = (
    _PRELUDE
    + """
stats()
purge()
if #ARGV[15] > 0 and redis.call('EXISTS', K_AKEY) == 0 then
  redis.call('SET', K_AKEY, ARGV[15])
end
local idh, text, answer, captured = ARGV[5], ARGV[7], ARGV[8], ARGV[12] == '1'
local max_docs, max_bytes = tonumber(ARGV[9]), tonumber(ARGV[10])
local meta = cjson.decode(ARGV[6])
meta.created = NOW
meta.captured = captured or nil
local add = true
local old_raw = redis.call('HGET', K_DOCS, idh)
if old_raw and not live(idh) then  -- expired, not yet purged: gone
  remove(idh)
  old_raw = false
end
if old_raw then
  local old = cjson.decode(old_raw)
  meta.created = old.created
  redis.call('HINCRBY', K_STAT, 'bytes', 0 - (old.meta_bytes or 0))
  drop_names(idh, old)
  local cost = index_drop(idh, old)
  if old.captured then
    redis.call('HINCRBY', K_STAT, 'cbytes', -(captured_cost(old) + cost))
    redis.call('ZREM', K_CAP, idh)
  end
  redis.call('ZREM', K_ANS, idh)
  if old.sha256 == meta.sha256 then add = false else drop_ref(old.sha256, old.bytes) end
end
local bkey = B .. 'b:' .. meta.sha256
if add and redis.call('HINCRBY', K_REFS, meta.sha256, 1) == 1 then
  redis.call('SET', bkey, text)
  redis.call('HINCRBY', K_STAT, 'bytes', meta.bytes)
end
redis.call('PEXPIRE', bkey, EXPIRE_MS)
redis.call('HINCRBY', K_STAT, 'bytes', meta.meta_bytes)
meta.num = redis.call('HINCRBY', K_STAT, 'seq', 1) % 4294967296
local cost = index_add(idh, struct.pack('>I4', meta.num), ARGV[11]) or 0
redis.call('HSET', K_DOCS, idh, cjson.encode(meta))
for _, n in ipairs(meta.names) do redis.call('HSET', K_NAMES, n, idh) end
redis.call('ZADD', K_LRU, NOW, idh)
if answer == '1' then redis.call('ZADD', K_ANS, NOW, idh) end
if captured then
  redis.call('ZADD', K_CAP, NOW, idh)
  redis.call('HINCRBY', K_STAT, 'cbytes', captured_cost(meta) + cost)
  max_docs, max_bytes = tonumber(ARGV[13]), tonumber(ARGV[14])
end
-- the oldest of this document's kind, other than itself (nil: none); the documents passed
-- over stay in place, so each later call starts after them (one pass over the list in all)
local passed = 0
local function victim()
  if captured then
    for _, v in ipairs(redis.call('ZRANGE', K_CAP, 0, 1)) do
      if v ~= idh then return v end
    end
    return nil
  end
  while true do
    local batch = redis.call('ZRANGE', K_LRU, passed, passed + 15)
    if #batch == 0 then return nil end
    for _, v in ipairs(batch) do
      if v ~= idh and not redis.call('ZSCORE', K_CAP, v) then return v end
      passed = passed + 1
    end
  end
end
local function over()
  local total, cbytes = stored_bytes()
  local caps = redis.call('ZCARD', K_CAP)
  if captured then return caps > max_docs or cbytes > max_bytes end
  return redis.call('ZCARD', K_LRU) - caps > max_docs or total - cbytes > max_bytes
end
while over() do
  local v = victim()
  if not v or not remove(v) then break end
end
keep_alive()
return meta.created
"""
)

# ARGV[5..11]: max docs, max bytes, recent, retrieve, packed query anchors, id hashes and
# name hashes (each packed: 32 hex characters per hash).
# Returns [id, sha256, bytes, path, language, created, text, kind, ...] for each chosen
# document (path and language nil when absent), where kind is "named" (by id or name),
# "answer" (a captured answer) or "retrieved".
SELECT = (
    _PRELUDE
    + """
stats()
purge()
local max_docs, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
local recent, retrieve, query = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local cands, kinds = {}, {}
local function add(idh, kind)
  cands[#cands + 1] = idh
  kinds[#kinds + 1] = kind
end
for i = 1, #ARGV[10], 32 do add(string.sub(ARGV[10], i, i + 31), 'named') end
local names = {}
for i = 1, #ARGV[11], 32 do names[#names + 1] = string.sub(ARGV[11], i, i + 31) end
if #names > 0 then
  for _, idh in ipairs(redis.call('HMGET', K_NAMES, unpack(names))) do
    if idh then add(idh, 'named') end
  end
end
if recent > 0 then
  for _, idh in ipairs(redis.call('ZREVRANGE', K_ANS, 0, recent - 1)) do add(idh, 'answer') end
end
if retrieve > 0 and #query > 0 then
  local score, nums = {}, {}
  for _, list in ipairs(hmget(K_AX, split(query))) do
    if list then
      local share = 1 / (#list / 4)
      for i = 1, #list, 4 do
        local num = string.sub(list, i, i + 3)
        if not score[num] then nums[#nums + 1] = num; score[num] = 0 end
        score[num] = score[num] + share
      end
    end
  end
  table.sort(nums, function(a, b)
    if score[a] ~= score[b] then return score[a] > score[b] end
    return a > b
  end)
  local found = 0
  for i = 1, math.min(#nums, retrieve * RETRIEVE_SCAN) do
    if found == retrieve then break end
    local idh = redis.call('HGET', K_AN, nums[i])
    if idh and live(idh) then
      found = found + 1
      add(idh, redis.call('ZSCORE', K_ANS, idh) and 'answer' or 'retrieved')
    end
  end
end
local function optional(value)  -- JSON null (or absent) -> a nil reply
  if value == nil or value == cjson.null then return false end
  return value
end
local out, seen, total, count = {}, {}, 0, 0
for c, idh in ipairs(cands) do
  if count < max_docs and not seen[idh] then
    local raw = live(idh) and redis.call('HGET', K_DOCS, idh)
    if raw then
      seen[idh] = true
      local meta = cjson.decode(raw)
      if total + meta.bytes <= max_bytes then
        total, count = total + meta.bytes, count + 1
        local bkey = B .. 'b:' .. meta.sha256
        redis.call('ZADD', K_LRU, NOW, idh)
        redis.call('PEXPIRE', bkey, EXPIRE_MS)
        out[#out + 1] = meta.id
        out[#out + 1] = meta.sha256
        out[#out + 1] = meta.bytes
        out[#out + 1] = optional(meta.path)
        out[#out + 1] = optional(meta.language)
        out[#out + 1] = meta.created
        out[#out + 1] = redis.call('GET', bkey)
        out[#out + 1] = kinds[c]
      end
    end
  end
end
if count > 0 then keep_alive() end
return out
"""
)

# ARGV[5]: id hash. Returns 1 when a document was removed.
DELETE = (
    _PRELUDE
    + """
stats()
purge()
local was_live = live(ARGV[5])
if remove(ARGV[5]) and was_live then return 1 end
return 0
"""
)

# Returns [metadata JSON, last used, ...], most recently used first.
LIST = (
    _PRELUDE
    + """
stats()
purge()
local out = {}
local ranked = redis.call('ZREVRANGEBYSCORE', K_LRU, '+inf', CUTOFF, 'WITHSCORES')
for i = 1, #ranked, 2 do
  local raw = redis.call('HGET', K_DOCS, ranked[i])
  if raw then
    out[#out + 1] = raw
    out[#out + 1] = ranked[i + 1]
  end
end
return out
"""
)

# ARGV[5..]: fingerprint hash, then (sha256, token bytes) pairs. Caches only stored content.
PUT_TOKENS = (
    _PRELUDE
    + """
local fp, added = ARGV[5], false
for i = 6, #ARGV, 2 do
  if redis.call('HEXISTS', K_REFS, ARGV[i]) == 1 then
    redis.call('SET', B .. 't:' .. fp .. ':' .. ARGV[i], ARGV[i + 1], 'PX', EXPIRE_MS)
    added = true
  end
end
if added then
  redis.call('SADD', K_FPS, fp)
  redis.call('PEXPIRE', K_FPS, EXPIRE_MS)
end
return 0
"""
)

# KEYS[1]: the namespace's "akey" key; ARGV[1]: a fresh random key, ARGV[2]: native expiry in
# ms, ARGV[3]: "1" to store ARGV[1] when there is none. Returns the key (nil: none, not made).
ANCHOR_KEY = """
local k = redis.call('GET', KEYS[1])
if k or ARGV[3] ~= '1' then return k end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
