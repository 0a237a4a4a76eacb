package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/carbon"
)

// maxBody caps what is read from a provider; real answers are a few hundred bytes.
const maxBody = 1 << 20

// defaultClient is a backstop for callers that pass no client and no ctx deadline.
var defaultClient = &http.Client{Timeout: 30 * time.Second}

func clientOr(c *http.Client) *http.Client {
	if c != nil {
		return c
	}
	return defaultClient
}

// get performs req and returns the body of a 200, or a typed error naming the provider.
func get(ctx context.Context, c *http.Client, req *http.Request, name string, now time.Time) ([]byte, error) {
	resp, err := clientOr(c).Do(req.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("provider: %s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("provider: %s: reading body: %w", name, err)
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return nil, &carbon.RateLimitedError{Provider: name, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), now)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		snippet := string(body)
		if len(snippet) > 200 {
			snippet = snippet[:200]
		}
		return nil, &carbon.HTTPError{Provider: name, StatusCode: resp.StatusCode, Body: snippet}
	}
	return body, nil
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 10.2.3); anything else is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(24*time.Hour/time.Second) {
			n = int64(24 * time.Hour / time.Second) // a day is plenty; avoids overflow
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
