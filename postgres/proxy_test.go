package pgpipe_test

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// lossyProxy forwards TCP connections to the test server and, once armed, cuts the
// connection that carries the server's acknowledgment of the n-th COMMIT before the
// client receives it: the transaction is committed, but the client cannot know.
type lossyProxy struct {
	ln      net.Listener
	target  string
	dropAt  int64        // the COMMIT acknowledgment to lose (1-based); 0: none
	commits atomic.Int64 // COMMIT acknowledgments seen
	dropped atomic.Int64 // acknowledgments lost
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

// commitAck is the CommandComplete message of a COMMIT.
var commitAck = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

func newLossyProxy(t *testing.T, dropAt int64) (*lossyProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL(t))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &lossyProxy{ln: ln, target: u.Host, dropAt: dropAt}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *lossyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
		p.wg.Go(func() { p.serverToClient(c, s) })
	}
}

func (p *lossyProxy) serverToClient(c, s net.Conn) {
	defer func() { _ = c.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if k := int64(bytes.Count(chunk, commitAck)); k > 0 {
				if seen := p.commits.Add(k); p.dropAt > 0 && seen >= p.dropAt && seen-k < p.dropAt {
					p.dropped.Add(1)
					_ = s.Close() // the server committed; the client never hears of it
					return
				}
			}
			if _, werr := c.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *lossyProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
