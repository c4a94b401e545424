package graph

import (
	"fmt"
	"reflect"
	"unsafe"

	G "gorgonia.org/gorgonia"
)

// This file holds everything the executor knows of gorgonia that gorgonia
// does not export: the names of its statement ops, where gorgonia.Read
// keeps its destination, and which of its ops add into a preallocated
// buffer. gorgonia_test.go pins each of these against the gorgonia version
// in go.mod, so an upgrade that moves them fails there, by name, rather than
// somewhere in a run.

// gorgoniaPkg is the import path gorgonia's own op types carry.
const gorgoniaPkg = "gorgonia.org/gorgonia"

// isLetOp reports whether op is the op of gorgonia.Set, a statement that
// TapeMachine does not execute.
func isLetOp(op G.Op) bool { return isGorgoniaOp(op, "letOp") }

// isReadOp reports whether op is the op of gorgonia.Read, which copies its
// child's value out to a *gorgonia.Value (see readTarget).
func isReadOp(op G.Op) bool { return isGorgoniaOp(op, "readOp") }

// isGorgoniaOp reports whether op is gorgonia's (unexported) struct type of
// the given name.
func isGorgoniaOp(op G.Op, name string) bool {
	t := reflect.TypeOf(op)
	return t != nil && t.Kind() == reflect.Struct && t.Name() == name && t.PkgPath() == gorgoniaPkg
}

// readTarget returns where a gorgonia.Read node writes, or nil when op is not
// one. gorgonia keeps that pointer in the unexported field "into", so it is
// read through reflection.
func readTarget(op G.Op) *G.Value {
	if !isReadOp(op) {
		return nil
	}
	f := reflect.ValueOf(op).FieldByName("into")
	if !f.IsValid() || f.Kind() != reflect.Pointer || f.Type().Elem() != reflect.TypeOf((*G.Value)(nil)).Elem() {
		return nil
	}
	return (*G.Value)(unsafe.Pointer(f.Pointer()))
}

// accumulatesIntoPrealloc reports ops whose UsePreallocDo adds into the
// buffer it is given instead of overwriting it: gorgonia's sliceIncrOp (the
// gradient of Slice) is one. Handing such an op last run's output, or an
// output set with SetOutput, would add this run's result to what the buffer
// holds, so it always computes afresh.
func accumulatesIntoPrealloc(op G.Op) bool {
	return fmt.Sprintf("%T", op) == "gorgonia.sliceIncrOp"
}
