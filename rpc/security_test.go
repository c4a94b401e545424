package rpc

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/samehost"
	"github.com/tandemml/tandem/internal/wire"
)

// rawConn dials agent a and, with token non-nil, completes the hello.
func rawConn(t *testing.T, a *Agent, token []byte) (net.Conn, *bufio.Reader, byte) {
	t.Helper()
	return rawConnTo(t, a.ln.Addr().String(), token)
}

// rawConnTo is rawConn for the agent listening at addr.
func rawConnTo(t *testing.T, addr string, token []byte) (net.Conn, *bufio.Reader, byte) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	if token == nil {
		return nc, br, 0
	}
	status, _, err := dialAuth(nc, br, token, 0, cmaHello{}.append(nil)) // no same-host copies
	if err != nil {
		t.Fatal(err)
	}
	if status == statusOK {
		io.CopyN(io.Discard, br, cmaHelloLen)
		nc.Write([]byte{0})
		br.ReadByte()
	}
	return nc, br, status
}

// closedByPeer reports whether the peer closes nc (reading hits EOF).
func closedByPeer(br *bufio.Reader) bool {
	_, err := io.Copy(io.Discard, br)
	return err == nil // io.Copy returns nil at EOF
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	agents := startGroup(t, 2, registerBasics, WithMaxMessageSize(1<<20))
	ctx := context.Background()
	a1 := agents[1]
	x := dense([]int{3}, []float32{1, 2, 3})
	if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x); err != nil {
		t.Fatal(err)
	}

	// Garbage instead of a hello.
	nc, br, _ := rawConn(t, a1, nil)
	nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if !closedByPeer(br) {
		t.Fatal("garbage hello: connection not closed")
	}
	nc.Close()

	// Wrong token.
	nc, br, status := rawConn(t, a1, []byte("not the token"))
	if status != statusBadToken || !closedByPeer(br) {
		t.Fatalf("wrong token: status %d", status)
	}
	nc.Close()

	// Garbage after a good hello.
	nc, br, status = rawConn(t, a1, a1.token)
	if status != statusOK {
		t.Fatalf("good hello refused: %d", status)
	}
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = byte(i * 37)
	}
	nc.Write(garbage)
	if !closedByPeer(br) {
		t.Fatal("garbage frame: connection not closed")
	}
	nc.Close()

	// An oversized frame: the header announces more than the limit.
	nc, br, _ = rawConn(t, a1, a1.token)
	hdr := make([]byte, wire.HeaderLen)
	binary.LittleEndian.PutUint32(hdr[0:4], 10)
	binary.LittleEndian.PutUint64(hdr[4:12], 1<<40)
	hdr[12], hdr[14] = wire.KindRequest, wire.Version
	nc.Write(hdr)
	if !closedByPeer(br) {
		t.Fatal("oversized frame: connection not closed")
	}
	nc.Close()

	// The agent still serves everyone else, on the connection it had.
	if y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x); err != nil || !sameTensor(x, y) {
		t.Fatalf("after bad input: %v %v", y, err)
	}
	m := a1.Metrics()
	if m.MalformedFrames < 2 || m.ConnectionsRefused < 2 {
		t.Fatalf("metrics: %+v", m)
	}

	// A message over the limit is refused by its sender.
	big := dense([]int{1 << 19}, make([]float32, 1<<19))
	if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized call: %v", err)
	}
}

func TestReceiverLimitClosesConnection(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agents := mustInitEach(t, ctx, 2, func(r int) (string, []Option) {
		limit := int64(1 << 30)
		if r == 1 {
			limit = 1 << 16
		}
		return "", []Option{WithStore(st), WithRegistry(basics(r)), WithMaxMessageSize(limit)}
	})
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()
	big := dense([]int{1 << 16}, make([]float32, 1<<16))
	if _, err := Sync[*tensor.Dense](ctx, agents[0], "worker1", "echo", big); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("frame over the receiver's limit: %v", err)
	}
	// A fresh connection serves small calls. (A call racing with the
	// closing may still fail with ErrPeerLost, before the read loop has seen
	// the connection end.)
	v, err := Sync[int](ctx, agents[0], "worker1", "add", [2]int{1, 2})
	if errors.Is(err, ErrPeerLost) {
		v, err = Sync[int](ctx, agents[0], "worker1", "add", [2]int{1, 2})
	}
	if err != nil || v != 3 {
		t.Fatalf("after: %v %v", v, err)
	}
}

func TestWrongTokenRefused(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agents := mustInitEach(t, ctx, 2, func(r int) (string, []Option) {
		return "", []Option{WithStore(st), WithRegistry(basics(r)), WithToken([]string{"alpha", "beta"}[r])}
	})
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()
	_, err := Sync[int](ctx, agents[0], "worker1", "add", [2]int{1, 2})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "token") {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestGeneratedTokenIsShared(t *testing.T) {
	t.Setenv(TokenEnv, "")
	agents := startGroup(t, 2, registerBasics)
	if string(agents[0].token) != string(agents[1].token) || len(agents[0].token) < 32 {
		t.Fatalf("tokens %q %q", agents[0].token, agents[1].token)
	}
	if v, err := Sync[int](context.Background(), agents[1], "w0", "add", [2]int{1, 2}); err != nil || v != 3 {
		t.Fatalf("call: %v %v", v, err)
	}
}

// testTLS makes a CA and a certificate for 127.0.0.1 signed by it, and
// returns a mutual-TLS config.
func testTLS(t *testing.T) *tls.Config {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tandem test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "worker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS13,
	}
}

func TestMutualTLS(t *testing.T) {
	cfg := testTLS(t)
	agents := startGroup(t, 2, registerBasics, WithTLS(cfg))
	ctx := context.Background()
	x := dense([]int{1000}, make([]float32, 1000))
	if y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x); err != nil || !sameTensor(x, y) {
		t.Fatalf("TLS call: %v", err)
	}
	// Same-host copies work over TLS as well: the proofs are tied to the
	// TCP connection under it.
	if c, want := agents[0].peers[1].cur.Load(), samehost.Supported && samehost.BootID() != ([16]byte{}); c.sendByRef != want || c.recvByRef != want {
		t.Fatalf("same-host copies over TLS: send %v recv %v, want %v", c.sendByRef, c.recvByRef, want)
	}
	// A client without a certificate is refused at the handshake.
	nc, err := tls.Dial("tcp", agents[1].ln.Addr().String(), &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS13})
	if err == nil {
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = nc.Write([]byte(helloMagic))
		if err == nil {
			_, err = nc.Read(make([]byte, 1))
		}
		nc.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate got through")
	}
	// A plain TCP client is refused too.
	raw, br, _ := rawConn(t, agents[1], nil)
	raw.Write(append([]byte(helloMagic), 1, 0, 0, 0, 0, 0, 0))
	if !closedByPeer(br) {
		t.Fatal("plain TCP client not refused")
	}
	raw.Close()
}

func TestInitErrors(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agents, errs := initEach(ctx, 3, func(r int) (string, []Option) {
		if r == 2 {
			return "ps", []Option{WithStore(st)}
		}
		return "trainer", []Option{WithStore(st)}
	})
	for _, a := range agents {
		if a != nil {
			a.Close()
		}
	}
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `"trainer" is used by ranks [0 1]`) {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// A missing rank is named when the rendezvous times out.
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	_, err := Init(sctx, "lonely", 0, 2, WithStore(store.NewMemory()))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "ranks 1 of 2") {
		t.Fatalf("missing rank: %v", err)
	}
	if _, err := Init(ctx, "x", 2, 2, WithStore(st)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad rank: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		st := store.NewMemory()
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		agents := mustInitEach(t, ctx, 3, func(r int) (string, []Option) {
			return "", []Option{WithStore(st), WithRegistry(basics(r))}
		})
		for i := 0; i < 20; i++ {
			Async[int](ctx, agents[i%3], []string{"worker0", "worker1", "worker2"}[(i+1)%3], "add", [2]int{i, 1})
		}
		if _, err := Sync[int](ctx, agents[0], "worker2", "relay", [2]int{1, 1}); err != nil {
			t.Fatal(err)
		}
		for i, err := range shutdownAll(agents) {
			if err != nil {
				t.Fatalf("shutdown %d: %v", i, err)
			}
		}
	}()
	testkit.RequireNoLeak(t, before, testkit.Slack(2))
}

// TestInitFromEnvReadsLaunch: InitFromEnv reads the job through package
// launch, whose errors name the launcher and the fix.
func TestInitFromEnvReadsLaunch(t *testing.T) {
	for _, v := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
		"MASTER_ADDR", "MASTER_PORT", "TANDEM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
		"TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE",
		"PET_MASTER_ADDR", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
		"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
		"SLURM_PROCID", "SLURM_STEP_ID", "SLURM_NTASKS", TokenEnv} {
		t.Setenv(v, "") // empty reads as unset
	}
	ctx := context.Background()
	_, err := InitFromEnv(ctx, "")
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "no launcher detected") || !strings.Contains(err.Error(), "tandem run") {
		t.Fatalf("no variables: %v", err)
	}
	t.Setenv("RANK", "x")
	t.Setenv("WORLD_SIZE", "2")
	if _, err := InitFromEnv(ctx, ""); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `RANK="x"`) {
		t.Fatalf("bad RANK: %v", err)
	}
	t.Setenv("RANK", "1")
	if _, err := InitFromEnv(ctx, ""); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "MASTER_ADDR") ||
		!strings.Contains(err.Error(), "rpc.WithStore") {
		t.Fatalf("no master: %v", err)
	}
	t.Setenv("RANK", "")
	t.Setenv("WORLD_SIZE", "")
	// mpirun -np 1: a world of one needs no store.
	t.Setenv("OMPI_COMM_WORLD_RANK", "0")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "1")
	a, err := InitFromEnv(ctx, "")
	if err != nil {
		t.Fatalf("Open MPI world of one: %v", err)
	}
	if a.Self() != (WorkerInfo{Name: "worker0", ID: 0}) || len(a.Workers()) != 1 {
		t.Errorf("self %v, workers %v", a.Self(), a.Workers())
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
