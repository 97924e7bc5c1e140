package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// blockKey names the contents of a full KV block together with everything
// before it: key_i = SHA-256(key_{i-1} || the block's token ids as int32
// little-endian), key_{-1} = 32 zero bytes. Equal keys mean equal prefixes
// (up to SHA-256 collisions; lookups also compare the block's own tokens).
type blockKey [sha256.Size]byte

func chainKey(parent blockKey, tokens []int32) blockKey {
	buf := make([]byte, len(parent)+4*len(tokens))
	copy(buf, parent[:])
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[len(parent)+4*i:], uint32(t))
	}
	return sha256.Sum256(buf)
}

const noBlock = -1

// blockPool is the KV block manager: reference counts, a free list, and with
// prefix caching a key -> block map plus an LRU of cached blocks nobody uses.
//
// Every block is in exactly one state:
//   - used: refs > 0 (owned by one or more sequences);
//   - free: refs == 0, no key, on the free list;
//   - cached: refs == 0, has a key, on the LRU list (reusable on a key hit,
//     evicted when the free list is empty).
//
// A used block may also have a key (a full block other sequences can share).
// Not safe for concurrent use: the engine's step loop owns it.
type blockPool struct {
	blockSize int
	prefix    bool

	refs   []int32
	hashed []bool
	keys   []blockKey
	tokens []int32 // numBlocks*blockSize: contents of hashed blocks
	byKey  map[blockKey]int32

	free []int32 // stack; popped from the end

	lruPrev, lruNext []int32
	lruHead, lruTail int32 // head = least recently used
	lruLen           int
}

func newBlockPool(numBlocks, blockSize int, prefixCaching bool) *blockPool {
	p := &blockPool{
		blockSize: blockSize,
		prefix:    prefixCaching,
		refs:      make([]int32, numBlocks),
		hashed:    make([]bool, numBlocks),
		free:      make([]int32, numBlocks),
		lruPrev:   make([]int32, numBlocks),
		lruNext:   make([]int32, numBlocks),
		lruHead:   noBlock,
		lruTail:   noBlock,
	}
	if prefixCaching {
		p.keys = make([]blockKey, numBlocks)
		p.tokens = make([]int32, numBlocks*blockSize)
		p.byKey = make(map[blockKey]int32)
	}
	for i := range p.free { // pop order 0, 1, 2, ...
		p.free[i] = int32(numBlocks - 1 - i)
	}
	return p
}

func (p *blockPool) numBlocks() int { return len(p.refs) }

// available is how many blocks an allocation can take now.
func (p *blockPool) available() int { return len(p.free) + p.lruLen }

func (p *blockPool) numFree() int   { return len(p.free) }
func (p *blockPool) numCached() int { return p.lruLen }
func (p *blockPool) numUsed() int   { return p.numBlocks() - p.available() }

// allocate takes n blocks, from the free list first and then by evicting the
// least recently used cached blocks. It returns nil if fewer than n are
// available (and then changes nothing).
func (p *blockPool) allocate(n int) []int32 {
	if n > p.available() {
		return nil
	}
	out := make([]int32, 0, n)
	for len(out) < n {
		var id int32
		if k := len(p.free); k > 0 {
			id = p.free[k-1]
			p.free = p.free[:k-1]
		} else {
			id = p.lruHead
			p.lruRemove(id)
			delete(p.byKey, p.keys[id])
			p.hashed[id] = false
		}
		p.refs[id] = 1
		out = append(out, id)
	}
	return out
}

// acquire adds a reference to blocks found by lookup, taking cached ones off
// the LRU list.
func (p *blockPool) acquire(ids []int32) {
	for _, id := range ids {
		if p.refs[id] == 0 {
			p.lruRemove(id)
		}
		p.refs[id]++
	}
}

// release drops one reference from each block. Blocks reaching zero go to
// the LRU list if they carry a key, else to the free list. They are released
// last to first, so a sequence's tail blocks are evicted before its head
// (the head is the more shareable prefix).
func (p *blockPool) release(ids []int32) {
	for _, id := range slices.Backward(ids) {
		p.refs[id]--
		if p.refs[id] > 0 {
			continue
		}
		if p.hashed[id] {
			p.lruPushBack(id)
		} else {
			p.free = append(p.free, id)
		}
	}
}

// lookup returns the blocks holding the longest cached prefix described by
// keys (one per full block of tokens, in order), checking each block's
// tokens too.
func (p *blockPool) lookup(keys []blockKey, tokens []int32) []int32 {
	if !p.prefix {
		return nil
	}
	var hit []int32
	for i, k := range keys {
		id, ok := p.byKey[k]
		if !ok || !slices.Equal(p.blockTokens(id), tokens[i*p.blockSize:(i+1)*p.blockSize]) {
			break
		}
		hit = append(hit, id)
	}
	return hit
}

// countUnreferenced is how many of ids are cached blocks with no owner:
// acquiring them takes them away from what allocate can use.
func (p *blockPool) countUnreferenced(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.refs[id] == 0 {
			n++
		}
	}
	return n
}

// register records that used block id holds a full block with the given key
// and tokens, making it shareable. A block that already has a key, or a key
// that another block already holds, is left as it is.
func (p *blockPool) register(id int32, key blockKey, tokens []int32) {
	if !p.prefix || p.hashed[id] {
		return
	}
	if _, dup := p.byKey[key]; dup {
		return
	}
	p.hashed[id] = true
	p.keys[id] = key
	copy(p.blockTokens(id), tokens)
	p.byKey[key] = id
}

// forget drops the prefix-cache keys of ids (used blocks), so they can no
// longer be found by lookup and go to the free list when released.
func (p *blockPool) forget(ids []int32) {
	if !p.prefix {
		return
	}
	for _, id := range ids {
		if !p.hashed[id] {
			continue
		}
		if p.byKey[p.keys[id]] == id {
			delete(p.byKey, p.keys[id])
		}
		p.hashed[id] = false
		p.keys[id] = blockKey{}
	}
}

func (p *blockPool) blockTokens(id int32) []int32 {
	return p.tokens[int(id)*p.blockSize : (int(id)+1)*p.blockSize]
}

func (p *blockPool) lruPushBack(id int32) {
	p.lruPrev[id] = p.lruTail
	p.lruNext[id] = noBlock
	if p.lruTail != noBlock {
		p.lruNext[p.lruTail] = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
	p.lruLen++
}

func (p *blockPool) lruRemove(id int32) {
	prev, next := p.lruPrev[id], p.lruNext[id]
	if prev != noBlock {
		p.lruNext[prev] = next
	} else {
		p.lruHead = next
	}
	if next != noBlock {
		p.lruPrev[next] = prev
	} else {
		p.lruTail = prev
	}
	p.lruLen--
}
