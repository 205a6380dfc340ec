// Package ssetest reads a server-sent event stream in tests, by the rules
// an EventSource follows (HTML Living Standard, "Server-sent events"):
// fields up to a blank line make one message; a line starting with a colon
// is a comment.
package ssetest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Event is one message of a stream, or one comment line.
type Event struct {
	ID, Data string
	Comment  bool
}

// Record is the first record of a Redfish Event message: its MessageId
// and OriginOfCondition.
func (e Event) Record(t testing.TB) (messageID, origin string) {
	t.Helper()
	var body struct {
		Events []struct {
			MessageId         string
			OriginOfCondition struct {
				ID string `json:"@odata.id"`
			}
		}
	}
	if err := json.Unmarshal([]byte(e.Data), &body); err != nil || len(body.Events) != 1 {
		t.Fatalf("event %q: %v", e.Data, err)
	}
	return body.Events[0].MessageId, body.Events[0].OriginOfCondition.ID
}

// Stream is an open stream; Events receives what it carries until it ends.
type Stream struct {
	Response *http.Response
	Events   chan Event
}

// Open sends GET url with HTTP Basic credentials and the extra headers
// (Host names the request's host). A
// 200 answer is read as a stream until the test ends; any other is
// returned with a nil Stream and left for the caller to read.
func Open(t testing.TB, c *http.Client, url, user, pass string, header map[string]string) (*Stream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range header {
		if k == "Host" {
			req.Host = v // a virtual host's stream
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, resp
	}
	s := &Stream{Response: resp, Events: make(chan Event, 256)}
	t.Cleanup(func() { resp.Body.Close() })
	go s.read()
	return s, resp
}

func (s *Stream) read() {
	defer close(s.Events)
	r := bufio.NewReader(s.Response.Body)
	var e Event
	pending := false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		switch {
		case line == "":
			if pending {
				s.Events <- e
			}
			e, pending = Event{}, false
		case strings.HasPrefix(line, ":"):
			s.Events <- Event{Comment: true, Data: line}
		default:
			name, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch name {
			case "id":
				e.ID = value
			case "data":
				if e.Data != "" {
					e.Data += "\n"
				}
				e.Data += value
			}
			pending = true
		}
	}
}

// Next is the next message that is not a comment; the test fails after
// within without one.
func (s *Stream) Next(t testing.TB, within time.Duration) Event {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case e, ok := <-s.Events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if !e.Comment {
				return e
			}
		case <-timeout:
			t.Fatalf("no event within %v", within)
		}
	}
}

// Quiet fails the test if a message comes within d.
func (s *Stream) Quiet(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case e, ok := <-s.Events:
			if ok && !e.Comment {
				t.Fatalf("unexpected event %s", e.Data)
			}
			if !ok {
				return
			}
		case <-deadline:
			return
		}
	}
}
