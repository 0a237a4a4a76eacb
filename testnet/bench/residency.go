package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// residencyMetric is the histogram a node in front of an external engine keeps of its residency
// model's error per request: |predicted − reported cached tokens| ÷ prompt tokens. Most requests
// of a trace with little reuse are trivially right (nothing predicted, nothing cached), so the
// predicted and reported cached-token totals are read beside it.
const (
	residencyMetric  = "kvmesh_residency_error_ratio_bucket"
	predictedMetric  = "kvmesh_residency_predicted_cached_tokens_total"
	reportedMetric   = "kvmesh_residency_reported_cached_tokens_total"
	predictedTotalLe = -1 // buckets' keys for the two totals: no bound is negative
	reportedTotalLe  = -2
)

// ResidencyError summarises the residency model's error over one run's requests, read from the
// nodes' histograms (so a quantile is interpolated inside its bucket, as histogram_quantile does).
type ResidencyError struct {
	Judged int     `json:"judged"` // requests the engines reported cached tokens for
	P50    float64 `json:"p50"`
	P90    float64 `json:"p90"`
	// Predicted and Reported are the cached prompt tokens the models predicted and the engines
	// reported over the same requests.
	Predicted float64 `json:"predicted_cached_tokens"`
	Reported  float64 `json:"reported_cached_tokens"`
}

// buckets maps a bucket's upper bound to its cumulative count, summed over nodes.
type buckets map[float64]float64

// scrapeResidency sums the residency histogram over the nodes at urls. A node without the
// histogram (an embedded engine) adds nothing.
func scrapeResidency(ctx context.Context, urls []string) (buckets, error) {
	sum := buckets{}
	return sum, scrapeEach(ctx, urls, func(r io.Reader) error { return parseBuckets(r, sum) })
}

// scrapeEach reads every node's /metrics at urls, in turn, into parse.
func scrapeEach(ctx context.Context, urls []string, parse func(io.Reader) error) error {
	for _, u := range urls {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := scrapeInto(ctx, strings.TrimSuffix(u, "/")+"/metrics", parse)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func scrapeInto(ctx context.Context, url string, parse func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("bench: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: scrape %s: %s", url, resp.Status)
	}
	return parse(resp.Body)
}

// parseBuckets adds the residency histogram's lines of a text exposition to sum.
func parseBuckets(r io.Reader, sum buckets) error {
	return scanLines(r, func(line string) error {
		if total, ok := totalKey(line); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' '):]), 64)
			if err != nil {
				return fmt.Errorf("bench: malformed line %q", line)
			}
			sum[total] += v
			return nil
		}
		le, n, ok, err := sample(line, residencyMetric, "le")
		if !ok || err != nil {
			return err
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return fmt.Errorf("bench: malformed bucket line %q", line)
		}
		sum[bound] += n
		return nil
	})
}

// scanLines calls each with every line of a text exposition, until it returns an error.
func scanLines(r io.Reader, each func(line string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if err := each(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// sample parses line as a sample of metric: its label's value and the sample's value. ok is
// false for a line of another metric.
func sample(line, metric, label string) (lv string, v float64, ok bool, err error) {
	if !strings.HasPrefix(line, metric+"{") {
		return "", 0, false, nil
	}
	_, rest, _ := strings.Cut(line, label+`="`)
	lv, rest, found := strings.Cut(rest, `"`)
	fields := strings.Fields(rest)
	if !found || len(fields) < 2 {
		return "", 0, true, fmt.Errorf("bench: malformed line %q", line)
	}
	if v, err = strconv.ParseFloat(fields[1], 64); err != nil {
		return "", 0, true, fmt.Errorf("bench: malformed line %q", line)
	}
	return lv, v, true, nil
}

// totalKey reports whether line is one of the two cached-token totals, and its key in buckets.
func totalKey(line string) (float64, bool) {
	switch {
	case strings.HasPrefix(line, predictedMetric+" "):
		return predictedTotalLe, true
	case strings.HasPrefix(line, reportedMetric+" "):
		return reportedTotalLe, true
	}
	return 0, false
}

// since returns the counts of b gathered after before (histograms are cumulative over a
// testnet's life, which spans several loads).
func (b buckets) since(before buckets) buckets {
	d := buckets{}
	for le, n := range b {
		d[le] = n - before[le]
	}
	return d
}

// summary returns the judged count and the interpolated median and 90th percentile.
func (b buckets) summary() ResidencyError {
	les := make([]float64, 0, len(b))
	for le := range b {
		if le >= 0 {
			les = append(les, le)
		}
	}
	sort.Float64s(les)
	if len(les) == 0 || b[les[len(les)-1]] <= 0 {
		return ResidencyError{}
	}
	total := b[les[len(les)-1]]
	q := func(p float64) float64 {
		rank, lo, below := p*total, 0.0, 0.0
		for _, le := range les {
			if n := b[le]; n >= rank {
				if le > 1e300 || n == below { // +Inf, or a bucket that adds nothing
					return lo
				}
				return lo + (le-lo)*(rank-below)/(n-below)
			}
			lo, below = le, b[le]
		}
		return lo
	}
	return ResidencyError{Judged: int(total), P50: q(0.5), P90: q(0.9), Predicted: b[predictedTotalLe], Reported: b[reportedTotalLe]}
}
