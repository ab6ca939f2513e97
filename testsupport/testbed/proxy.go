package testbed

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxies are TCP proxies, in the test's own process and on loopback only,
// in front of each node's client listener of a [LocalCluster]: clients that
// bootstrap from Brokers reach every node through its proxy (each node
// advertises its proxy's address on that listener), and the test cuts and
// heals the network between them and one node. The nodes' own traffic
// (replication, the controller quorum) and the cluster's Admin do not pass
// through them. They are closed when the test ends.
type Proxies struct {
	// Brokers are the bootstrap addresses through the proxies.
	Brokers []string
	nodes   map[int]*proxy
}

// Proxied starts the proxies of c (kafka-cluster.sh chose their ports, and
// each node advertises its proxy's, when it configured the cluster).
func (c *LocalCluster) Proxied(tb testing.TB) *Proxies {
	tb.Helper()
	f, err := os.Open(filepath.Join(c.stateDir, "cluster", "proxies"))
	if err != nil {
		tb.Fatalf("testbed: the cluster has no proxy listeners (configured by an older kafka-cluster.sh? clean it): %v", err)
	}
	defer f.Close()
	px := &Proxies{nodes: map[int]*proxy{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// node, the proxy's address, the node's client listener.
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			tb.Fatalf("testbed: proxies file line %q: want node, listen address, target address", sc.Text())
		}
		node, err := strconv.Atoi(fields[0])
		if err != nil {
			tb.Fatalf("testbed: proxies file line %q: %v", sc.Text(), err)
		}
		p, err := startProxy(fields[1], fields[2])
		if err != nil {
			tb.Fatalf("testbed: proxy for node %d: %v", node, err)
		}
		tb.Cleanup(p.close)
		px.nodes[node] = p
		px.Brokers = append(px.Brokers, fields[1])
	}
	if err := sc.Err(); err != nil || len(px.nodes) == 0 {
		tb.Fatalf("testbed: read the proxies file: %v (%d proxies)", err, len(px.nodes))
	}
	return px
}

// Cut stalls every connection through node's proxy, as a network partition
// between the clients and that node would: no byte passes either way, and
// new connections are accepted and held, until Heal. Clients find out only
// by their own timeouts.
func (px *Proxies) Cut(node int) error { return px.set(node, true) }

// Held returns how many chunks of bytes or new connections node's proxy has
// held back because it was cut: the evidence that a cut struck traffic.
func (px *Proxies) Held(node int) int64 {
	if p, ok := px.nodes[node]; ok {
		return p.held.Load()
	}
	return 0
}

// Heal lets bytes through node's proxy again; connections that the clients
// have not given up on carry on.
func (px *Proxies) Heal(node int) error { return px.set(node, false) }

func (px *Proxies) set(node int, cut bool) error {
	p, ok := px.nodes[node]
	if !ok {
		return fmt.Errorf("no proxy for node %d", node)
	}
	p.setCut(cut)
	return nil
}

// proxy forwards connections from a listener to one target.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	open   chan struct{} // closed while bytes may pass; replaced by Cut
	closed chan struct{} // closed by close
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	held   atomic.Int64 // passes that had to wait for a heal
}

func startProxy(listen, target string) (*proxy, error) {
	if !isLoopback(listen) || !isLoopback(target) {
		return nil, fmt.Errorf("proxy %s -> %s: loopback addresses only", listen, target)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, open: make(chan struct{}), closed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		if cut {
			p.open = make(chan struct{})
		}
	default:
		if !cut {
			close(p.open)
		}
	}
}

// pass blocks while the proxy is cut; false once it is closed.
func (p *proxy) pass() bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	default:
	}
	p.held.Add(1)
	select {
	case <-open:
		return true
	case <-p.closed:
		return false
	}
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
		p.conns[c] = struct{}{}
		return true
	}
}

func (p *proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) handle(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	if !p.pass() {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the node is down: the client sees its connection close
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done // either side ending closes both, which ends the other
	<-done
}

// pipe copies src to dst, holding each chunk while the proxy is cut.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, a reset, or the other side closed it
		}
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return
	default:
	}
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
