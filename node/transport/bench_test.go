package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"
)

func benchPair(b *testing.B, h Handler) (client, server *node) {
	b.Helper()
	dir := pki(b, "a", "b")
	server = startNode(b, loadTLS(b, dir, "b"), "127.0.0.1:0", h)
	client = startNode(b, loadTLS(b, dir, "a"), "127.0.0.1:0", nil)
	return client, server
}

// BenchmarkForwardTTFB measures one forward on a warm connection: open a stream, send header
// and a chat-sized body, get the accept and the first data byte.
func BenchmarkForwardTTFB(b *testing.B) {
	chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	client, server := benchPair(b, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {
		_ = w.Accept(200, map[string]string{"Content-Type": "text/event-stream"})
		_, _ = w.Write(chunk)
		_, _ = w.Write(chunk)
	}))
	body := bytes.Repeat([]byte("x"), 2048)
	h := Header{RequestID: "bench", Tenant: "t", Endpoint: EndpointChat, Blocks: make([]uint64, 32)}
	ctx := context.Background()
	one := make([]byte, 1)
	warm, err := client.tr.Forward(ctx, server.addr(), h, body)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, warm.Body)
	var ttfb time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		resp, err := client.tr.Forward(ctx, server.addr(), h, body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, one); err != nil {
			b.Fatal(err)
		}
		ttfb += time.Since(start)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	b.ReportMetric(float64(ttfb.Microseconds())/float64(b.N), "ttfb-us")
}

// BenchmarkForwardThroughput measures relayed response bytes through one forward, for SSE-sized
// writes and bulk writes.
func BenchmarkForwardThroughput(b *testing.B) {
	const total = 8 << 20
	for _, size := range []int{128, 16 << 10} {
		b.Run("chunk="+strconv.Itoa(size), func(b *testing.B) {
			chunk := bytes.Repeat([]byte("y"), size)
			client, server := benchPair(b, HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {
				for sent := 0; sent < total; sent += size {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			}))
			ctx := context.Background()
			b.SetBytes(total)
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				resp, err := client.tr.Forward(ctx, server.addr(), Header{RequestID: "tp"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				if err != nil || n != total {
					b.Fatal(fmt.Errorf("relayed %d bytes: %w", n, err))
				}
				_ = resp.Body.Close()
			}
			b.ReportMetric(float64(total)*float64(b.N)/time.Since(start).Seconds()/1e6, "MB/s-relayed")
			b.ReportMetric(float64(total/size), "chunks/op")
		})
	}
}
