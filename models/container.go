package models

import (
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

// NameChild makes child the child called name of a container: it prefixes
// every tensor name in child's state_dict with name and a dot, so a Linear's
// "weight" becomes "encoder.weight" and a nested "0.bias" becomes
// "encoder.0.bias", the keys PyTorch gives the same module assigned as an
// attribute (add_module). Sequential and Container call it; a container
// written without Container calls it once per child while being built. The
// renaming is permanent: a module belongs to at most one container. name
// must be non-empty and free of dots.
func NameChild(name string, child Module) error {
	if err := checkName(name); err != nil {
		return err
	}
	if child == nil {
		return fmt.Errorf("models: child %q has no module: %w", name, errs.InvalidArgument)
	}
	for _, p := range StateDict(child) {
		p.Name = name + "." + p.Name
	}
	return nil
}

// Container keeps the parameters, buffers and children of a module written
// by the user, as torch.nn.Module's register_parameter, register_buffer and
// add_module do. Embed it in the module's struct, register while building,
// and write only Forward: the module then has the Params, Buffers and
// StateDict of the equivalent PyTorch module (its own parameters, its own
// buffers, then each child's entries in the order added), so checkpoints
// and DDP see it exactly as they see the ready models.
//
// The zero value is an empty container. A Container is not safe for
// concurrent registration.
type Container struct {
	params, buffers []*Param
	children        []Child
	names           map[string]bool
}

// claim reserves name among the container's parameters, buffers and
// children.
func (c *Container) claim(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if c.names[name] {
		return fmt.Errorf("models: the container already has a parameter, buffer or child named %q: %w", name, errs.InvalidArgument)
	}
	if c.names == nil {
		c.names = map[string]bool{}
	}
	c.names[name] = true
	return nil
}

// AddParam registers p (made by NewParam) as one of the container's own
// learnable parameters, under its current name.
func (c *Container) AddParam(p *Param) error {
	if p == nil || p.Value == nil {
		return fmt.Errorf("models: AddParam: a parameter without a value: %w", errs.InvalidArgument)
	}
	if err := c.claim(p.Name); err != nil {
		return err
	}
	c.params = append(c.params, p)
	return nil
}

// AddBuffer registers b (made by NewBuffer) as one of the container's own
// buffers: saved in the state_dict, not learned.
func (c *Container) AddBuffer(b *Param) error {
	if b == nil || b.Value == nil {
		return fmt.Errorf("models: AddBuffer: a buffer without a value: %w", errs.InvalidArgument)
	}
	if err := c.claim(b.Name); err != nil {
		return err
	}
	c.buffers = append(c.buffers, b)
	return nil
}

// AddChild registers m as the child called name and renames its tensors
// with NameChild.
func (c *Container) AddChild(name string, m Module) error {
	if m == nil {
		return fmt.Errorf("models: child %q has no module: %w", name, errs.InvalidArgument)
	}
	if err := c.claim(name); err != nil {
		return err
	}
	if err := NameChild(name, m); err != nil {
		return err
	}
	c.children = append(c.children, Child{Name: name, Module: m})
	return nil
}

// Children returns the registered children in order.
func (c *Container) Children() []Child { return append([]Child(nil), c.children...) }

// Params returns the container's own parameters, then each child's, in
// order (PyTorch's parameters()).
func (c *Container) Params() []*Param {
	out := append([]*Param(nil), c.params...)
	for _, ch := range c.children {
		out = append(out, ch.Module.Params()...)
	}
	return out
}

// Buffers returns the container's own buffers, then each child's.
func (c *Container) Buffers() []*Param {
	out := append([]*Param(nil), c.buffers...)
	for _, ch := range c.children {
		out = append(out, ch.Module.Buffers()...)
	}
	return out
}

// StateDict returns the own parameters, the own buffers, then each child's
// state_dict in order: PyTorch's state_dict order.
func (c *Container) StateDict() []*Param {
	out := append(append([]*Param(nil), c.params...), c.buffers...)
	for _, ch := range c.children {
		out = append(out, StateDict(ch.Module)...)
	}
	return out
}
