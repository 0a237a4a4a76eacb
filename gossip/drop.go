package gossip

import (
	"fmt"
	"log"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// dropTransport is memberlist's own UDP and TCP transport, less what Config.Drop drops: a
// packet to a dropped address is lost without a word, as UDP loses it, and a stream to one
// fails to connect. Between members that drop each other that is a network partition.
type dropTransport struct {
	*memberlist.NetTransport
	drop func(to string) bool
}

var _ memberlist.NodeAwareTransport = (*dropTransport)(nil)

// newDropTransport binds memberlist's transport as memberlist.Create would for mlc, and wraps
// it; mlc's ports are set to the bound one when it picks a free port.
func newDropTransport(mlc *memberlist.Config, drop func(string) bool) (*dropTransport, error) {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{mlc.BindAddr},
		BindPort:  mlc.BindPort,
		Logger:    log.New(mlc.LogOutput, "", log.LstdFlags),
	}
	// As memberlist does: a free port is bound for TCP first, then for UDP, which another
	// process may hold; try a few.
	var nt *memberlist.NetTransport
	var err error
	for range 10 {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || mlc.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if mlc.BindPort == 0 {
		mlc.BindPort = nt.GetAutoBindPort()
		mlc.AdvertisePort = mlc.BindPort
	}
	return &dropTransport{NetTransport: nt, drop: drop}, nil
}

func (t *dropTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.drop(addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *dropTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.drop(a.Addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteToAddress(b, a)
}

func (t *dropTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.drop(addr) {
		return nil, fmt.Errorf("gossip: stream to %s dropped", addr)
	}
	return t.NetTransport.DialTimeout(addr, timeout)
}

func (t *dropTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.drop(a.Addr) {
		return nil, fmt.Errorf("gossip: stream to %s dropped", a.Addr)
	}
	return t.NetTransport.DialAddressTimeout(a, timeout)
}
