package console

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The simulated screen: small, so a full update is cheap.
const (
	ScreenWidth  = 64
	ScreenHeight = 48
)

// RFBVersion is the protocol version the screen offers (RFC 6143).
const RFBVersion = "RFB 003.008\n"

// ErrRFB is a client that broke the protocol.
var ErrRFB = errors.New("RFB protocol error")

// ServeRFB is the guest's screen, the server side of RFB 3.8 over conn:
// the version and security handshake (security type None: the stream is
// authenticated where it is reached, as KubeVirt's is), ServerInit with a
// ScreenWidth × ScreenHeight framebuffer named name, then every
// non-incremental FramebufferUpdateRequest answered with the whole screen
// in Raw encoding (nothing ever changes, so incremental ones get nothing).
// Key and pointer events are read and dropped. It returns nil when the
// client hangs up between messages, ErrRFB when it breaks the protocol.
func ServeRFB(conn io.ReadWriter, name string) error {
	if _, err := io.WriteString(conn, RFBVersion); err != nil {
		return err
	}
	version := make([]byte, len(RFBVersion))
	if _, err := io.ReadFull(conn, version); err != nil {
		return err
	}
	if !bytes.HasPrefix(version, []byte("RFB 003.")) {
		return fmt.Errorf("%w: client version %q", ErrRFB, version)
	}
	const securityNone = 1
	if _, err := conn.Write([]byte{1, securityNone}); err != nil {
		return err
	}
	chosen := make([]byte, 1)
	if _, err := io.ReadFull(conn, chosen); err != nil {
		return err
	}
	if chosen[0] != securityNone {
		return fmt.Errorf("%w: security type %d was not offered", ErrRFB, chosen[0])
	}
	if _, err := conn.Write([]byte{0, 0, 0, 0}); err != nil { // SecurityResult OK
		return err
	}
	if _, err := io.ReadFull(conn, chosen); err != nil { // ClientInit's shared flag
		return err
	}
	var init bytes.Buffer
	_ = binary.Write(&init, binary.BigEndian, [2]uint16{ScreenWidth, ScreenHeight})
	init.Write(pixelFormat[:])
	_ = binary.Write(&init, binary.BigEndian, uint32(len(name)))
	init.WriteString(name)
	if _, err := conn.Write(init.Bytes()); err != nil {
		return err
	}
	return serveMessages(conn)
}

// pixelFormat is 32 bits per pixel, 24 deep, little-endian true colour.
var pixelFormat = [16]byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0}

// serveMessages reads the client's messages until it hangs up.
func serveMessages(conn io.ReadWriter) error {
	bytesPerPixel := 4
	kind := make([]byte, 1)
	for {
		if _, err := io.ReadFull(conn, kind); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch kind[0] {
		case 0: // SetPixelFormat: 3 padding bytes, then the format
			var msg [19]byte
			if _, err := io.ReadFull(conn, msg[:]); err != nil {
				return err
			}
			switch bpp := msg[3]; bpp {
			case 8, 16, 32:
				bytesPerPixel = int(bpp) / 8
			default:
				return fmt.Errorf("%w: %d bits per pixel", ErrRFB, bpp)
			}
		case 2: // SetEncodings: padding, count, count encodings
			var head [3]byte
			if _, err := io.ReadFull(conn, head[:]); err != nil {
				return err
			}
			if _, err := io.CopyN(io.Discard, conn, 4*int64(binary.BigEndian.Uint16(head[1:]))); err != nil {
				return err
			}
		case 3: // FramebufferUpdateRequest: incremental, x, y, width, height
			var msg [9]byte
			if _, err := io.ReadFull(conn, msg[:]); err != nil {
				return err
			}
			if msg[0] == 0 {
				if err := sendScreen(conn, bytesPerPixel); err != nil {
					return err
				}
			}
		case 4: // KeyEvent
			if _, err := io.CopyN(io.Discard, conn, 7); err != nil {
				return err
			}
		case 5: // PointerEvent
			if _, err := io.CopyN(io.Discard, conn, 5); err != nil {
				return err
			}
		case 6: // ClientCutText: padding, length, text
			var head [7]byte
			if _, err := io.ReadFull(conn, head[:]); err != nil {
				return err
			}
			if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(head[3:]))); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: client message type %d", ErrRFB, kind[0])
		}
	}
}

// sendScreen sends the whole screen, one Raw rectangle of one grey.
func sendScreen(w io.Writer, bytesPerPixel int) error {
	var msg bytes.Buffer
	msg.Write([]byte{0, 0, 0, 1}) // FramebufferUpdate, padding, one rectangle
	_ = binary.Write(&msg, binary.BigEndian, [4]uint16{0, 0, ScreenWidth, ScreenHeight})
	_ = binary.Write(&msg, binary.BigEndian, int32(0)) // Raw
	msg.Write(bytes.Repeat([]byte{0x80}, ScreenWidth*ScreenHeight*bytesPerPixel))
	_, err := w.Write(msg.Bytes())
	return err
}

// Screen is what a client learns from the handshake.
type Screen struct {
	Width, Height uint16
	Name          string
}

// Handshake is the client side of the RFB 3.8 handshake with security type
// None, up to ServerInit, followed by a request for the whole screen whose
// update it reads: what proves a VNC path carries RFB both ways.
func Handshake(conn io.ReadWriter) (Screen, error) {
	version := make([]byte, len(RFBVersion))
	if _, err := io.ReadFull(conn, version); err != nil {
		return Screen{}, err
	}
	if string(version) != RFBVersion {
		return Screen{}, fmt.Errorf("%w: server version %q", ErrRFB, version)
	}
	if _, err := io.WriteString(conn, RFBVersion); err != nil {
		return Screen{}, err
	}
	count := make([]byte, 1)
	if _, err := io.ReadFull(conn, count); err != nil {
		return Screen{}, err
	}
	types := make([]byte, count[0])
	if _, err := io.ReadFull(conn, types); err != nil {
		return Screen{}, err
	}
	if !bytes.Contains(types, []byte{1}) {
		return Screen{}, fmt.Errorf("%w: security types %v offer no None", ErrRFB, types)
	}
	if _, err := conn.Write([]byte{1}); err != nil {
		return Screen{}, err
	}
	var result uint32
	if err := binary.Read(conn, binary.BigEndian, &result); err != nil {
		return Screen{}, err
	}
	if result != 0 {
		return Screen{}, fmt.Errorf("%w: security result %d", ErrRFB, result)
	}
	if _, err := conn.Write([]byte{1}); err != nil { // ClientInit, shared
		return Screen{}, err
	}
	var init struct {
		Width, Height uint16
		Format        [16]byte
		NameLength    uint32
	}
	if err := binary.Read(conn, binary.BigEndian, &init); err != nil {
		return Screen{}, err
	}
	if init.NameLength > 1<<10 {
		return Screen{}, fmt.Errorf("%w: a name of %d bytes", ErrRFB, init.NameLength)
	}
	name := make([]byte, init.NameLength)
	if _, err := io.ReadFull(conn, name); err != nil {
		return Screen{}, err
	}
	screen := Screen{Width: init.Width, Height: init.Height, Name: string(name)}
	request := []byte{3, 0, 0, 0, 0, 0}
	request = binary.BigEndian.AppendUint16(request, init.Width)
	request = binary.BigEndian.AppendUint16(request, init.Height)
	if _, err := conn.Write(request); err != nil {
		return screen, err
	}
	var update struct {
		Kind, Padding       uint8
		Rectangles          uint16
		X, Y, Width, Height uint16
		Encoding            int32
	}
	if err := binary.Read(conn, binary.BigEndian, &update); err != nil {
		return screen, err
	}
	if update.Kind != 0 || update.Rectangles != 1 || update.Width != init.Width || update.Height != init.Height || update.Encoding != 0 {
		return screen, fmt.Errorf("%w: update %+v is not the whole screen in Raw", ErrRFB, update)
	}
	bytesPerPixel := int64(init.Format[0] / 8)
	_, err := io.CopyN(io.Discard, conn, int64(update.Width)*int64(update.Height)*bytesPerPixel)
	return screen, err
}
