package tokenauth

import (
	"bytes"
	"testing"
)

// exchange runs the four messages between a dialer holding dtok and an
// acceptor holding atok, with the nonces given, and reports what each side
// concluded.
func exchange(dtok, atok string, dn, an Nonce, bind []byte) (dialerOK, acceptorOK bool) {
	dk, ak := NewKey([]byte(dtok), "test"), NewKey([]byte(atok), "test")
	proof := dk.Prove(Dialer, dn, an, bind)
	if !ak.Verify(Dialer, dn, an, proof, bind) {
		return false, false
	}
	verdict := ak.Prove(Acceptor, dn, an, bind)
	return dk.Verify(Acceptor, dn, an, verdict, bind), true
}

func nonce(t *testing.T) Nonce {
	t.Helper()
	n, err := NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSameTokenAgrees(t *testing.T) {
	d, a := exchange("s3cret", "s3cret", nonce(t), nonce(t), []byte("rank 1"))
	if !d || !a {
		t.Fatalf("same token: dialer ok %v, acceptor ok %v; want both", d, a)
	}
	d, a = exchange("", "", nonce(t), nonce(t), nil)
	if !d || !a {
		t.Fatalf("both without a token: dialer ok %v, acceptor ok %v; want both", d, a)
	}
}

func TestWrongTokenRefused(t *testing.T) {
	for _, c := range [][2]string{{"s3cret", "other"}, {"", "s3cret"}, {"s3cret", ""}, {"s3cret", "s3cre"}} {
		if _, a := exchange(c[0], c[1], nonce(t), nonce(t), nil); a {
			t.Errorf("dialer token %q, acceptor token %q: the acceptor accepted", c[0], c[1])
		}
	}
	// An acceptor with another token cannot prove itself to the dialer
	// either, whatever the dialer sent.
	dn, an := nonce(t), nonce(t)
	dk, ak := NewKey([]byte("s3cret"), "test"), NewKey([]byte("other"), "test")
	if dk.Verify(Acceptor, dn, an, ak.Prove(Acceptor, dn, an)) {
		t.Fatal("the dialer accepted an acceptor with another token")
	}
}

// A recorded proof does not open a new connection: the verifying side's
// nonce is fresh, and the proof is bound to the old one.
func TestReplayFails(t *testing.T) {
	k := NewKey([]byte("s3cret"), "test")
	dn, an := nonce(t), nonce(t)
	recorded := k.Prove(Dialer, dn, an, []byte("session 7"))
	// The attacker replays the dialer's hello (dn) and proof; the acceptor
	// challenges with a fresh nonce.
	if k.Verify(Dialer, dn, nonce(t), recorded, []byte("session 7")) {
		t.Fatal("a recorded dialer proof verified against a fresh acceptor nonce")
	}
	// The attacker plays the acceptor and replays its recorded challenge
	// and verdict to a dialer, whose nonce is fresh.
	verdict := k.Prove(Acceptor, dn, an, []byte("session 7"))
	if k.Verify(Acceptor, nonce(t), an, verdict, []byte("session 7")) {
		t.Fatal("a recorded acceptor verdict verified against a fresh dialer nonce")
	}
}

// A peer cannot hand a side's own proof back to it as the other role's.
func TestReflectionFails(t *testing.T) {
	k := NewKey([]byte("s3cret"), "test")
	dn, an := nonce(t), nonce(t)
	// The attacker dials A, receives A's challenge an, then dials A a second
	// time choosing the nonces so that A as acceptor of the second
	// connection would prove over the same transcript; the attacker gets
	// A's acceptor MAC and sends it back as a dialer's proof.
	stolen := k.Prove(Acceptor, dn, an)
	if k.Verify(Dialer, dn, an, stolen) {
		t.Fatal("an acceptor's proof verified as a dialer's")
	}
	if k.Verify(Acceptor, dn, an, k.Prove(Dialer, dn, an)) {
		t.Fatal("a dialer's proof verified as an acceptor's")
	}
	// Swapping the nonces does not help either.
	if k.Verify(Dialer, an, dn, stolen) {
		t.Fatal("an acceptor's proof verified as a dialer's with the nonces swapped")
	}
}

func TestBindingAndProtocolCount(t *testing.T) {
	k := NewKey([]byte("s3cret"), "store")
	dn, an := nonce(t), nonce(t)
	p := k.Prove(Dialer, dn, an, []byte("rank 1"))
	if k.Verify(Dialer, dn, an, p, []byte("rank 2")) {
		t.Fatal("a proof for rank 1 verified for rank 2")
	}
	if k.Verify(Dialer, dn, an, p, []byte("rank"), []byte(" 1")) {
		t.Fatal("the split between bound parts does not count")
	}
	if k.Verify(Dialer, dn, an, p) {
		t.Fatal("a proof with bound bytes verified without them")
	}
	if NewKey([]byte("s3cret"), "rpc").Verify(Dialer, dn, an, p, []byte("rank 1")) {
		t.Fatal("a store proof verified for another protocol")
	}
	if !k.Verify(Dialer, dn, an, p, []byte("rank 1")) {
		t.Fatal("the genuine proof does not verify")
	}
}

func TestKeyDoesNotHoldToken(t *testing.T) {
	tok := []byte("a-token-that-must-not-leak")
	k := NewKey(tok, "test")
	if bytes.Contains(k.k[:], tok) {
		t.Fatal("the key holds the token")
	}
	if k.Empty() || !NewKey(nil, "test").Empty() {
		t.Fatal("Empty is wrong")
	}
	m := k.Prove(Dialer, Nonce{}, Nonce{})
	if bytes.Contains(m[:], tok[:8]) {
		t.Fatal("the proof holds token bytes")
	}
}

func TestNoncesAreFresh(t *testing.T) {
	a, b := nonce(t), nonce(t)
	if a == b || a == (Nonce{}) {
		t.Fatalf("two nonces alike or zero: %x %x", a, b)
	}
}

func TestZeroKeyPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Prove with a zero Key did not panic")
		}
	}()
	var k Key
	k.Prove(Dialer, Nonce{}, Nonce{})
}
