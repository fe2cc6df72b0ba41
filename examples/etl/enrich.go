package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gopipeline/pipeline"
)

// errNotFound and errMalformed are the service's permanent errors.
var (
	errNotFound  = errors.New("no enrichment for the record")
	errMalformed = errors.New("malformed response")
)

// statusError is a 429 or 503: worth retrying, after the delay the server asked for.
type statusError struct {
	code  int
	after time.Duration
}

func (e *statusError) Error() string {
	return fmt.Sprintf("service: %d %s (retry after %v)", e.code, http.StatusText(e.code), e.after)
}

// enricher returns the enrich stage's function: one GET per attempt.
func enricher(client *http.Client, addr string) func(ctx context.Context, r record) (enriched, error) {
	return func(ctx context.Context, r record) (enriched, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/enrich/"+strconv.Itoa(r.ID), nil)
		if err != nil {
			return enriched{}, pipeline.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return enriched{}, err // a timeout, or the connection: the classifier decides
		}
		defer resp.Body.Close() //nolint:errcheck // read to the end below
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err != nil {
			return enriched{}, err
		}
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusNotFound:
			return enriched{}, pipeline.Permanent(fmt.Errorf("record %d: %w", r.ID, errNotFound))
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			// Transient, and the retry waits at least what the server asked for.
			after, _ := pipeline.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			return enriched{}, pipeline.RetryAfter(&statusError{resp.StatusCode, after}, after)
		default:
			return enriched{}, pipeline.Fatal(fmt.Errorf("service: unexpected status %d", resp.StatusCode))
		}
		var e enrichment
		if err := json.Unmarshal(body, &e); err != nil {
			return enriched{}, pipeline.Permanent(fmt.Errorf("record %d: %w: %w", r.ID, errMalformed, err))
		}
		return enriched{record: r, Score: e.Score, Segment: e.Segment}, nil
	}
}

// classify decides the errors the function did not mark: a timeout or a network error
// is transient (retried); anything else stops the run.
func classify(err error) pipeline.Class {
	var ne net.Error
	switch {
	case errors.Is(err, pipeline.ErrTimeout), errors.As(err, &ne):
		return pipeline.ClassTransient
	}
	return pipeline.ClassFatal
}
