package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// service is the slow, flaky HTTP service the example enriches records with. It runs on
// loopback, in the example's own process, and decides each record's fate from its id
// (a hash, so that a rerun sees the same faults):
//
//	0.5 %  404 Not Found: the record has no enrichment (a permanent error)
//	0.5 %  200 with a malformed body (a permanent error)
//	1 %    429 or 503 with "Retry-After: 1" on the first call, and again on any call
//	       that comes sooner than that; then 200
//	0.3 %  the first call hangs until the client gives up (a timeout); then 200
//	the rest: 200 after a latency with a long tail (median ~2 ms, p99 ~20 ms)
type service struct {
	srv  *http.Server
	addr string
	seed uint64

	mu    sync.Mutex
	calls map[int]int       // calls per record id
	until map[int]time.Time // a 429/503's Retry-After, per record id
}

func startService(seed uint64) (*service, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &service{addr: ln.Addr().String(), seed: seed, calls: map[int]int{}, until: map[int]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /enrich/{id}", s.enrich)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }() // Serve returns ErrServerClosed on Close
	return s, nil
}

func (s *service) close() error { return s.srv.Close() }

// roll returns a number in [0, 1) from the id, the attempt and a salt.
func (s *service) roll(id int, salt string) float64 {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%d/%d/%s", s.seed, id, salt) // a hash.Hash never fails a write
	return float64(h.Sum64()>>11) / (1 << 53)
}

func (s *service) enrich(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		http.Error(w, "bad id", http.StatusBadRequest)
		return
	}
	fate := s.roll(id, "fate")
	s.mu.Lock()
	call := s.calls[id]
	s.calls[id]++
	early := fate >= 0.010 && fate < 0.020 && (call == 0 || time.Now().Before(s.until[id]))
	if early && call == 0 {
		s.until[id] = time.Now().Add(time.Second)
	}
	s.mu.Unlock()
	switch {
	case fate < 0.005:
		http.Error(w, "no such record", http.StatusNotFound)
		return
	case fate < 0.010:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"score": tru`))
		return
	case early:
		w.Header().Set("Retry-After", "1")
		code := http.StatusTooManyRequests
		if fate < 0.015 {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, http.StatusText(code), code)
		return
	case fate >= 0.020 && fate < 0.023 && call == 0:
		<-r.Context().Done() // hang until the client goes away
		return
	}
	// A long tail: log-normal around 2 ms.
	u := s.roll(id, "latency")
	z := math.Sqrt(-2*math.Log(1-u)) * math.Cos(2*math.Pi*s.roll(id, "phase"))
	d := time.Duration(2e6 * math.Exp(0.9*z))
	select {
	case <-time.After(min(d, 200*time.Millisecond)):
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(enrichment{Score: int(s.roll(id, "score") * 1000), Segment: []string{"a", "b", "c"}[id%3]})
}

// enrichment is what the service returns.
type enrichment struct {
	Score   int    `json:"score"`
	Segment string `json:"segment"`
}
