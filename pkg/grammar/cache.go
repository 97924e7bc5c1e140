package grammar

import (
	"container/list"
	"sync"
)

// lru is a small thread-safe cache of compiled grammars by spec. An evicted
// Grammar is only dropped from the cache: whoever holds it keeps using it
// (its C memory is freed when it becomes unreachable).
type lru struct {
	mu    sync.Mutex
	max   int
	order *list.List // front = most recent; values are *lruEntry
	byKey map[Spec]*list.Element
}

type lruEntry struct {
	spec Spec
	g    *Grammar
}

func newLRU(max int) *lru {
	return &lru{max: max, order: list.New(), byKey: make(map[Spec]*list.Element)}
}

func (c *lru) get(spec Spec) *Grammar {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[spec]
	if !ok {
		return nil
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry).g
}

// add caches g under spec and returns the cached grammar: g, or the one a
// concurrent compile of the same spec cached first.
func (c *lru) add(spec Spec, g *Grammar) *Grammar {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[spec]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*lruEntry).g
	}
	if c.max <= 0 {
		return g
	}
	c.byKey[spec] = c.order.PushFront(&lruEntry{spec: spec, g: g})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(*lruEntry).spec)
	}
	return g
}

func (c *lru) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
