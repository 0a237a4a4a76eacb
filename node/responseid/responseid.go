package responseid

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Response ids. The engine that ran a response keeps its state (what previous_response_id
// continues), so a continuation must reach that node, and no node keeps a table of who ran
// what: the id says it. The node that runs a response returns its engine's id E as
//
//	resp_<tag>_<E>
//
// where tag is Tag of the node's name (16 hex digits), and restores E in the
// previous_response_id it hands its engine. An ingress finds the member whose name has the
// tag; a node that left the mesh took its responses with it (404 previous_response_not_found).
const Prefix = "resp_"

// Tag names a node in the response ids it issues.
func Tag(name string) string { return fmt.Sprintf("%016x", xxhash.Sum64String(name)) }

// ID is the id the client sees for engine id engineID run on the node of tag.
func ID(tag, engineID string) string { return Prefix + tag + "_" + engineID }

// Parse splits an id ID made into its tag and engine id.
func Parse(id string) (tag, engineID string, ok bool) {
	rest, ok := strings.CutPrefix(id, Prefix)
	if !ok || len(rest) < 18 || rest[16] != '_' {
		return "", "", false
	}
	tag = rest[:16]
	for _, c := range tag {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", "", false
		}
	}
	return tag, rest[17:], true
}

// maxResponseLine bounds one line of an engine's Responses answer that the node rewrites.
const maxResponseLine = 16 << 20

// Rewrite rewrites the engine's response id in an answer to /v1/responses, a JSON
// object or a stream of server-sent events, into ID(tag, id). The id is the object's
// top-level "id", or in a stream the first event's "response.id" (response.created); from
// then on every occurrence of it as a JSON string is rewritten (the final response object
// repeats it). Other bytes pass as they are. A JSON answer is read whole; a stream line by
// line, each line passed on as soon as it is read.
func Rewrite(r io.Reader, contentType, tag string) io.Reader {
	if !strings.HasPrefix(contentType, "text/event-stream") {
		b, err := io.ReadAll(io.LimitReader(r, maxResponseLine+1))
		if err == nil && len(b) > maxResponseLine {
			err = fmt.Errorf("engine answer over %d bytes", maxResponseLine)
		}
		if from, to := findResponseID(b, tag); from != nil {
			b = bytes.ReplaceAll(b, from, to)
		}
		return io.MultiReader(bytes.NewReader(b), errReader{err})
	}
	return &idRewriter{br: bufio.NewReaderSize(r, 64<<10), tag: tag}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// idRewriter is Rewrite for a stream.
type idRewriter struct {
	br       *bufio.Reader
	tag      string
	from, to []byte // the engine's id and the tagged one, quoted; nil until seen
	pending  []byte
	err      error
}

func (r *idRewriter) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		line, err := readLine(r.br)
		if r.from == nil {
			r.from, r.to = findResponseID(line, r.tag)
		}
		if r.from != nil {
			line = bytes.ReplaceAll(line, r.from, r.to)
		}
		r.pending, r.err = line, err
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// readLine reads through the next newline, at most maxResponseLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
		if len(line) > maxResponseLine {
			return line, fmt.Errorf("engine answer has a line over %d bytes", maxResponseLine)
		}
	}
}

// findResponseID reads the response id from one line of an answer (the whole JSON object, or
// an SSE data line) and returns it and its tagged form, quoted as JSON; nil if the line has none.
func findResponseID(line []byte, tag string) (from, to []byte) {
	data := bytes.TrimSpace(line)
	if d, ok := bytes.CutPrefix(data, []byte("data:")); ok {
		data = bytes.TrimSpace(d)
	}
	var v struct {
		ID       string `json:"id"`
		Object   string `json:"object"`
		Response *struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &v) != nil {
		return nil, nil
	}
	id := v.ID
	if v.Object != "response" {
		id = ""
		if v.Response != nil {
			id = v.Response.ID
		}
	}
	if id == "" {
		return nil, nil
	}
	from, _ = json.Marshal(id)
	to, _ = json.Marshal(ID(tag, id))
	return from, to
}
