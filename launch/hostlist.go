package launch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/internal/errs"
)

// MaxHostlist is the most host names ExpandHostlist returns; a longer list is
// refused rather than expanded into memory.
const MaxHostlist = 1 << 20

// hostPattern is one item of a hostlist: literal text and bracket groups in
// turn, standing for the cartesian product of the groups, leftmost group
// varying slowest ("r[1-2]n[1-2]" is r1n1, r1n2, r2n1, r2n2).
type hostPattern struct {
	lits   []string     // len(groups)+1 pieces of literal text around the groups
	groups [][]numRange // each group's ranges, in order
}

// numRange is lo..hi inclusive, printed zero-padded to width digits.
type numRange struct {
	lo, hi uint64
	width  int
}

func (r numRange) count() uint64 { return r.hi - r.lo + 1 }

func (r numRange) format(v uint64) string {
	s := strconv.FormatUint(v, 10)
	if len(s) < r.width {
		s = strings.Repeat("0", r.width-len(s)) + s
	}
	return s
}

// ExpandHostlist expands a Slurm hostlist expression, the compressed form
// of SLURM_JOB_NODELIST and SLURM_STEP_NODELIST, into host names in order:
//
//	node[01-04,07]       node01 node02 node03 node04 node07
//	a,b[1-2],c           a b1 b2 c
//	rack[1-2]-n[1-2]     rack1-n1 rack1-n2 rack2-n1 rack2-n2
//	n[8-10]              n8 n9 n10
//
// Items are separated by commas outside brackets. A bracket holds
// comma-separated numbers and lo-hi ranges; a range is zero-padded to the
// number of digits of its lower bound, as Slurm writes it ("01-10" gives
// 01..10, "1-10" gives 1..10). Several bracket groups in one item expand to
// every combination, the leftmost varying slowest. Duplicates are kept:
// Slurm's lists have none. Malformed lists (unbalanced or nested brackets,
// empty items or groups, lo > hi, non-digits in a bracket) and lists of more
// than MaxHostlist names are errors wrapping errs.InvalidArgument.
func ExpandHostlist(list string) ([]string, error) {
	pats, total, err := parseHostlist(list)
	if err != nil {
		return nil, err
	}
	if total > MaxHostlist {
		return nil, fmt.Errorf("%w: launch: hostlist %q names %d hosts, more than the %d this reads", errs.InvalidArgument, clip(list), total, MaxHostlist)
	}
	hosts := make([]string, 0, total)
	for _, p := range pats {
		hosts = p.expand(hosts)
	}
	return hosts, nil
}

// FirstHost returns the first host name of a Slurm hostlist expression (see
// ExpandHostlist) without expanding the rest, after checking that the whole
// list is well formed. Under srun's default block and cyclic distributions
// task 0 runs on this host.
func FirstHost(list string) (string, error) {
	pats, _, err := parseHostlist(list)
	if err != nil {
		return "", err
	}
	p := pats[0]
	var b strings.Builder
	for i, g := range p.groups {
		b.WriteString(p.lits[i])
		b.WriteString(g[0].format(g[0].lo))
	}
	b.WriteString(p.lits[len(p.groups)])
	return b.String(), nil
}

func (p hostPattern) expand(out []string) []string {
	idx := make([]uint64, len(p.groups))   // position within each group
	cur := make([]numRange, len(p.groups)) // the range each position falls in
	for {
		var b strings.Builder
		for i, g := range p.groups {
			b.WriteString(p.lits[i])
			v, r := p.at(g, idx[i])
			cur[i] = r
			b.WriteString(r.format(v))
		}
		b.WriteString(p.lits[len(p.groups)])
		out = append(out, b.String())
		// Advance the rightmost group; carry to the left.
		i := len(p.groups) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < groupCount(p.groups[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return out
		}
	}
}

// at returns the k-th number of group g and the range it belongs to.
func (hostPattern) at(g []numRange, k uint64) (uint64, numRange) {
	for _, r := range g {
		if k < r.count() {
			return r.lo + k, r
		}
		k -= r.count()
	}
	panic("launch: hostlist index out of range") // unreachable: callers stay below groupCount
}

func groupCount(g []numRange) uint64 {
	var n uint64
	for _, r := range g {
		n = satAdd(n, r.count())
	}
	return n
}

// parseHostlist parses every item of list and returns them with the total
// number of names they stand for (saturating above MaxHostlist).
func parseHostlist(list string) ([]hostPattern, uint64, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: launch: hostlist %q: %s", errs.InvalidArgument, clip(list), fmt.Sprintf(format, a...))
	}
	if strings.TrimSpace(list) == "" {
		return nil, 0, bad("empty")
	}
	var (
		pats  []hostPattern
		total uint64
		start int
		depth int
	)
	for i := 0; i <= len(list); i++ {
		if i < len(list) {
			switch list[i] {
			case '[':
				if depth > 0 {
					return nil, 0, bad("nested '[' at byte %d", i)
				}
				depth++
				continue
			case ']':
				if depth == 0 {
					return nil, 0, bad("']' without '[' at byte %d", i)
				}
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		} else if depth > 0 {
			return nil, 0, bad("'[' not closed")
		}
		item := strings.TrimSpace(list[start:i])
		start = i + 1
		if item == "" {
			return nil, 0, bad("empty item")
		}
		p, n, err := parsePattern(item)
		if err != nil {
			return nil, 0, bad("%v", err)
		}
		pats = append(pats, p)
		total = satAdd(total, n)
	}
	return pats, total, nil
}

// parsePattern parses one item, which has balanced, unnested brackets.
func parsePattern(item string) (hostPattern, uint64, error) {
	var p hostPattern
	n := uint64(1)
	rest := item
	for {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			p.lits = append(p.lits, rest)
			break
		}
		end := strings.IndexByte(rest, ']') // after open: brackets are balanced and unnested
		p.lits = append(p.lits, rest[:open])
		g, err := parseGroup(rest[open+1 : end])
		if err != nil {
			return p, 0, fmt.Errorf("item %q: %v", item, err)
		}
		p.groups = append(p.groups, g)
		n = satMul(n, groupCount(g))
		rest = rest[end+1:]
	}
	for _, l := range p.lits {
		if strings.ContainsAny(l, " \t\n") {
			return p, 0, fmt.Errorf("item %q: a host name holds no spaces", item)
		}
	}
	if len(p.groups) == 0 && p.lits[0] == "" {
		return p, 0, fmt.Errorf("empty item")
	}
	return p, n, nil
}

// parseGroup parses the inside of one bracket: "01-04,07".
func parseGroup(s string) ([]numRange, error) {
	if s == "" {
		return nil, fmt.Errorf("empty brackets")
	}
	var g []numRange
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := parseDigits(lo)
		h, err2 := parseDigits(hi)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("[%s]: %q is not a number or a lo-hi range of numbers", s, part)
		}
		if l > h {
			return nil, fmt.Errorf("[%s]: range %q runs backwards", s, part)
		}
		g = append(g, numRange{lo: l, hi: h, width: len(lo)})
	}
	return g, nil
}

func parseDigits(s string) (uint64, error) {
	if s == "" || len(s) > 18 {
		return 0, fmt.Errorf("bad number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("bad number")
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

// satAdd and satMul saturate just above MaxHostlist, which is all the
// callers compare against.
func satAdd(a, b uint64) uint64 {
	if a > MaxHostlist || b > MaxHostlist {
		return MaxHostlist + 1
	}
	return a + b
}

func satMul(a, b uint64) uint64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > MaxHostlist || b > MaxHostlist || a*b > MaxHostlist {
		return MaxHostlist + 1
	}
	return a * b
}

// clip shortens a value quoted in an error message.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
