package testbed

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// A cut proxy passes no byte either way and holds new connections, as a
// network partition would; healed, the held bytes and connections go on;
// closed, it lets go of everything. Only loopback addresses are allowed.
func TestProxyCutsAndHealsTheNetwork(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	if _, err := startProxy("10.0.0.1:9", echo.Addr().String()); err == nil {
		t.Fatal("a proxy listening off loopback was started")
	}
	p, err := startProxy("127.0.0.1:0", echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	addr := p.ln.Addr().String()

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	// roundTrip writes line and says whether it came back within wait.
	roundTrip := func(c net.Conn, r *bufio.Reader, line string, wait time.Duration) bool {
		t.Helper()
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		got, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		if got != line+"\n" {
			t.Fatalf("read %q, want %q", got, line)
		}
		return true
	}
	readBack := func(r *bufio.Reader, c net.Conn, line string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != line+"\n" {
			t.Fatalf("after the heal read %q, %v; want %q", got, err, line)
		}
	}

	c1, r1 := dial()
	defer c1.Close()
	if !roundTrip(c1, r1, "before", 5*time.Second) {
		t.Fatal("nothing came back through a healthy proxy")
	}
	p.setCut(true)
	if roundTrip(c1, r1, "during", 500*time.Millisecond) {
		t.Fatal("bytes passed a cut proxy")
	}
	c2, r2 := dial() // accepted and held
	defer c2.Close()
	if roundTrip(c2, r2, "new", 500*time.Millisecond) {
		t.Fatal("a connection made during the cut passed bytes")
	}
	if got := p.held.Load(); got < 2 {
		t.Fatalf("the cut proxy says it held %d passes; want the chunk and the new connection", got)
	}
	p.setCut(false)
	readBack(r1, c1, "during")
	readBack(r2, c2, "new")
	if !roundTrip(c1, r1, "after", 5*time.Second) {
		t.Fatal("nothing came back after the heal")
	}

	p.setCut(true)
	done := make(chan struct{})
	go func() { p.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close hung on a cut proxy")
	}
}
