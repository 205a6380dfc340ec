package console

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestSerialPrintsBootLinesThenEchoes(t *testing.T) {
	s := NewSerial("vm-0")
	r := bufio.NewReader(s)
	for _, want := range BootLines("vm-0") {
		line, err := r.ReadString('\n')
		if err != nil || line != want+"\r\n" {
			t.Fatalf("boot line %q, %v; want %q", line, err, want)
		}
	}
	readExactly(t, r, Prompt("vm-0"))
	if _, err := s.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	readExactly(t, r, "root\r\n"+Prompt("vm-0"))
	s.Close()
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("read after close: %v, want EOF", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("write after close: %v, want ErrClosedPipe", err)
	}
}

func TestSerialHoldsTheWriterBackWhenNobodyReads(t *testing.T) {
	s := NewSerial("vm-0")
	wrote := make(chan int, 1)
	go func() {
		n, _ := s.Write(make([]byte, 2*MaxPending))
		wrote <- n
	}()
	select {
	case n := <-wrote:
		t.Fatalf("wrote %d bytes that nobody read, past the %d held", n, MaxPending)
	case <-time.After(100 * time.Millisecond):
	}
	s.mu.Lock()
	held := len(s.pending)
	s.mu.Unlock()
	if held > MaxPending {
		t.Errorf("holds %d bytes, more than %d", held, MaxPending)
	}
	s.Close()
	if n := <-wrote; n >= 2*MaxPending {
		t.Errorf("the blocked write reported %d bytes after close", n)
	}
}

func TestRFBHandshake(t *testing.T) {
	server, client := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- ServeRFB(server, "vm-0") }()
	screen, err := Handshake(client)
	if err != nil {
		t.Fatal(err)
	}
	if screen != (Screen{Width: ScreenWidth, Height: ScreenHeight, Name: "vm-0"}) {
		t.Errorf("screen %+v", screen)
	}
	client.Close()
	if err := <-served; err != nil {
		t.Errorf("server ended with %v after the client hung up", err)
	}
}

func TestRFBRefusesBrokenClients(t *testing.T) {
	for name, sent := range map[string]string{
		"not RFB":                   "GET / HTTP/1.1\r\n",
		"a security type unoffered": RFBVersion + "\x02",
		"an unknown message":        RFBVersion + "\x01\x01\xff",
	} {
		t.Run(name, func(t *testing.T) {
			server, client := net.Pipe()
			served := make(chan error, 1)
			go func() { served <- ServeRFB(server, "vm-0") }()
			go io.Copy(io.Discard, client)
			// net.Pipe's writes wait for reads: the server stops reading early.
			go client.Write([]byte(sent))
			if err := <-served; !errors.Is(err, ErrRFB) {
				t.Errorf("ServeRFB: %v, want ErrRFB", err)
			}
			client.Close()
		})
	}
}

func readExactly(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}
