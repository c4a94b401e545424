package comm

import "context"

// Binomial trees, rooted anywhere: ranks are renumbered v = (r - root) mod n
// so the root is 0; v's parent is v with its lowest set bit cleared, and its
// children are v + 2^j for every 2^j below that bit. A tree reaches all n
// ranks in ceil(log2 n) rounds. Buffers move in chunks, so a rank forwards
// chunk i while it receives chunk i+1.

const stepTree = 2

// treeLinks returns the parent (-1 at the root) and the children of this rank
// in the binomial tree rooted at root, children ordered from the largest
// subtree down.
func treeLinks(n, r, root int) (parent int, children []int) {
	v := (r - root + n) % n
	parent = -1
	mask := 1
	for mask < n {
		if v&mask != 0 {
			parent = (v - mask + root) % n
			break
		}
		mask <<= 1
	}
	for m := mask >> 1; m > 0; m >>= 1 {
		if v+m < n {
			children = append(children, (v+m+root)%n)
		}
	}
	return parent, children
}

// broadcastTree sends root's b to every rank's b.
func broadcastTree(ctx context.Context, c *opCtx, b []byte, dt dtype, root int) error {
	n := c.size()
	if n == 1 || len(b) == 0 {
		return nil
	}
	parent, children := treeLinks(n, c.rank(), root)
	chunk := c.chunkBytes(dt)
	nc := numChunks(b, chunk)
	return withSender(ctx, c, nc*len(children), func(ctx context.Context, s *sender) error {
		for i := range nc {
			p := chunkOf(b, i, chunk)
			if parent >= 0 {
				if err := c.recv(ctx, parent, stepTree, p); err != nil {
					return err
				}
			}
			for _, ch := range children {
				s.push(ch, stepTree, p)
			}
		}
		return nil
	})
}

// reduceTree reduces every rank's b into root's b with op. Other ranks' b are
// left unchanged.
func reduceTree(ctx context.Context, c *opCtx, b []byte, dt dtype, op ReduceOp, root int) error {
	if dt.isHalf() {
		return halfReduceRoot(ctx, c, b, dt, op, root)
	}
	n, r := c.size(), c.rank()
	isRoot := r == root
	if isRoot && op.kind == KindPremulSum {
		scaleBuf(b, dt, op.factor)
	}
	if n == 1 || len(b) == 0 {
		if isRoot && op.kind == KindAvg {
			divideBuf(b, dt, n)
		}
		return nil
	}
	// The reduce tree is the broadcast tree run backwards: a rank receives
	// from its children smallest subtree first, then sends to its parent.
	parent, children := treeLinks(n, r, root)
	for i, j := 0, len(children)-1; i < j; i, j = i+1, j-1 {
		children[i], children[j] = children[j], children[i]
	}
	acc := b
	if !isRoot && (len(children) > 0 || op.kind == KindPremulSum) {
		p := getScratch(len(b))
		defer putScratch(p)
		acc = *p
		copy(acc, b)
		if op.kind == KindPremulSum {
			scaleBuf(acc, dt, op.factor)
		}
	}
	chunk := c.chunkBytes(dt)
	nc := numChunks(acc, chunk)
	var tmp *[]byte
	if len(children) > 0 {
		tmp = getScratch(chunk)
		defer putScratch(tmp)
	}
	jobs := 0
	if parent >= 0 {
		jobs = nc
	}
	err := withSender(ctx, c, jobs, func(ctx context.Context, s *sender) error {
		for i := range nc {
			p := chunkOf(acc, i, chunk)
			for _, ch := range children {
				t := (*tmp)[:len(p)]
				if err := c.recv(ctx, ch, stepTree, t); err != nil {
					return err
				}
				reduceInto(p, t, dt, op.kind)
			}
			if parent >= 0 {
				s.push(parent, stepTree, p)
			}
		}
		return nil
	})
	if err == nil && isRoot && op.kind == KindAvg {
		divideBuf(b, dt, n)
	}
	return err
}
