package autograd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/rpctest"
)

// Installing distributed autograd installs rref, which it needs.
func TestExtensionRequiresRRef(t *testing.T) {
	agents := startGroup(t, 1, nil)
	if _, ok := agents[0].Extension("rref"); !ok {
		t.Fatal("autograd.Extension did not install rref")
	}
	if _, ok := agents[0].Extension("autograd"); !ok {
		t.Fatal("autograd.Extension did not install autograd")
	}
}

// An agent started without distributed autograd records nothing, and the
// package's functions fail on it saying how to install it.
func TestWithoutExtension(t *testing.T) {
	agents := rpctest.StartGroup(t, 1, nil)
	_, err := Begin(agents[0])
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "rpc.WithExtensions(autograd.Extension())") {
		t.Fatalf("Begin without autograd: %v", err)
	}
	if _, err := GetGradients(agents[0], 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("GetGradients without autograd: %v", err)
	}
	if _, err := NewRemoteModule(context.Background(), agents[0], "w0", "stage.new", stageConfig{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("NewRemoteModule without autograd: %v", err)
	}
	if ids := Contexts(agents[0]); len(ids) != 0 {
		t.Fatalf("Contexts without autograd: %v", ids)
	}
	if agents[0].Registry().Has(fnGrad) {
		t.Fatal("the protocol is registered on an agent without autograd")
	}
}
