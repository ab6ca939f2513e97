package integration

import (
	"net/netip"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
)

// A container's port is published on loopback when the engine runs on this
// machine, so that a test's database and broker are no one else's to
// reach; on every interface only for a remote engine. The PostgreSQL
// container was published on every interface (issue 47 item 17).
func TestPortsArePublishedOnLoopbackWhereTheEngineIsLocal(t *testing.T) {
	for _, tc := range []struct {
		daemonHost string
		want       netip.Addr
	}{
		{"localhost", netip.MustParseAddr("127.0.0.1")},
		{"127.0.0.1", netip.MustParseAddr("127.0.0.1")},
		{"::1", netip.MustParseAddr("::1")},
		{"127.0.0.2", netip.MustParseAddr("127.0.0.2")},
		{"docker.example", netip.Addr{}},
		{"10.1.2.3", netip.Addr{}},
	} {
		req := testcontainers.GenericContainerRequest{}
		if err := publish("5432/tcp", tc.daemonHost, "")(&req); err != nil {
			t.Fatal(err)
		}
		hc := &container.HostConfig{}
		req.HostConfigModifier(hc)
		got := hc.PortBindings[network.MustParsePort("5432/tcp")]
		if len(got) != 1 || got[0].HostIP != tc.want {
			t.Errorf("engine at %s: 5432/tcp published as %+v, want on %v", tc.daemonHost, got, tc.want)
		}
		if len(req.ExposedPorts) != 1 || req.ExposedPorts[0] != "5432/tcp" {
			t.Errorf("engine at %s: exposed %v", tc.daemonHost, req.ExposedPorts)
		}
	}
}
