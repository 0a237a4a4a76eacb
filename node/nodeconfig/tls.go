package nodeconfig

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/node/transport"
)

// LoadTLS sets TLS from the certificates in TLSDir (transport.LoadTLS), for this node's Name.
// It reads files; New does not.
func (c *Config) LoadTLS() error {
	if c.TLSDir == "" {
		return errors.New("node: no TLS directory")
	}
	t, err := transport.LoadTLS(c.TLSDir, c.Name)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	c.TLS = t
	return nil
}

// LoadDevTLS sets TLS from the development CA in DevCADir (or transport.DefaultDevCADir),
// creating it if there is none, and returns the directory it used. It reads and may write
// files; New does not.
func (c *Config) LoadDevTLS() (string, error) {
	dir := c.DevCADir
	if dir == "" {
		d, err := transport.DefaultDevCADir()
		if err != nil {
			return "", fmt.Errorf("node: %w", err)
		}
		dir = d
	}
	t, err := transport.DevTLS(dir, c.Name)
	if err != nil {
		return "", fmt.Errorf("node: %w", err)
	}
	c.TLS = t
	return dir, nil
}
