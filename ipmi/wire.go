package ipmi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// errMalformed marks a packet that cannot be decoded; such packets are
// dropped without an answer because nothing in them can be trusted.
var errMalformed = errors.New("malformed packet")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// RMCP (DMTF ASF) framing.
const (
	rmcpVersion1     = 0x06
	rmcpClassASF     = 0x06
	rmcpClassIPMI    = 0x07
	rmcpSeqNoAck     = 0xff
	rmcpHeaderLength = 4

	asfIANA        = 4542
	asfTypePing    = 0x80
	asfTypePong    = 0x40
	asfHeaderLen   = 8
	asfPongDataLen = 16
	// asfEntitiesIPMI: bit 7 says IPMI is supported, the low bits give
	// ASF version 1.0.
	asfEntitiesIPMI = 0x81
)

// decodeRMCP checks the RMCP header and returns its class, sequence number
// and the bytes after it.
func decodeRMCP(p []byte) (class, seq byte, body []byte, err error) {
	if len(p) < rmcpHeaderLength {
		return 0, 0, nil, malformed("RMCP header needs %d bytes, got %d", rmcpHeaderLength, len(p))
	}
	if p[0] != rmcpVersion1 {
		return 0, 0, nil, malformed("RMCP version %#x", p[0])
	}
	return p[3], p[2], p[rmcpHeaderLength:], nil
}

func rmcpHeader(class byte) []byte {
	return []byte{rmcpVersion1, 0, rmcpSeqNoAck, class}
}

// decodeASFPing returns the message tag of an ASF presence ping.
func decodeASFPing(body []byte) (tag byte, err error) {
	if len(body) < asfHeaderLen {
		return 0, malformed("ASF header needs %d bytes, got %d", asfHeaderLen, len(body))
	}
	if iana := binary.BigEndian.Uint32(body); iana != asfIANA {
		return 0, malformed("ASF enterprise number %d", iana)
	}
	if body[4] != asfTypePing {
		return 0, malformed("ASF message type %#x is not a presence ping", body[4])
	}
	return body[5], nil
}

// encodeASFPong answers a presence ping: IPMI supported, no ASF interactions.
func encodeASFPong(rmcpSeq, tag byte) []byte {
	p := []byte{rmcpVersion1, 0, rmcpSeq, rmcpClassASF}
	p = binary.BigEndian.AppendUint32(p, asfIANA)
	p = append(p, asfTypePong, tag, 0, asfPongDataLen)
	p = binary.BigEndian.AppendUint32(p, asfIANA)
	p = binary.BigEndian.AppendUint32(p, 0) // OEM-defined
	p = append(p, asfEntitiesIPMI, 0)
	return append(p, make([]byte, 6)...)
}

// IPMI LAN message (spec 13.8): rsAddr, netFn/rsLUN, checksum, rqAddr,
// rqSeq/rqLUN, cmd, data, checksum.
const minMessageLength = 7

type message struct {
	rsAddr byte
	netFn  byte // the request's (even) network function
	rsLUN  byte
	rqAddr byte
	rqSeq  byte // 6-bit sequence number
	rqLUN  byte
	cmd    byte
	data   []byte
}

// checksum is the two's complement of the byte sum, so that a checked
// range plus its checksum sums to zero.
func checksum(b []byte) byte {
	var sum byte
	for _, c := range b {
		sum += c
	}
	return -sum
}

func decodeMessage(p []byte) (message, error) {
	if len(p) < minMessageLength {
		return message{}, malformed("IPMI message needs %d bytes, got %d", minMessageLength, len(p))
	}
	if checksum(p[:3]) != 0 {
		return message{}, malformed("IPMI header checksum")
	}
	if checksum(p[3:]) != 0 {
		return message{}, malformed("IPMI data checksum")
	}
	return message{
		rsAddr: p[0],
		netFn:  p[1] >> 2,
		rsLUN:  p[1] & 3,
		rqAddr: p[3],
		rqSeq:  p[4] >> 2,
		rqLUN:  p[4] & 3,
		cmd:    p[5],
		data:   p[6 : len(p)-1],
	}, nil
}

// encodeResponse builds the response to m with completion code cc.
func (m message) encodeResponse(cc byte, data []byte) []byte {
	p := make([]byte, 0, minMessageLength+1+len(data))
	p = append(p, m.rqAddr, (m.netFn|1)<<2|m.rqLUN)
	p = append(p, checksum(p))
	p = append(p, m.rsAddr, m.rqSeq<<2|m.rsLUN, m.cmd, cc)
	p = append(p, data...)
	return append(p, checksum(p[3:]))
}

// IPMI 1.5 session header (spec 13.6).
const (
	authTypeNone     = 0x00
	authTypeMD5      = 0x02
	authTypePassword = 0x04
	authTypeRMCPPlus = 0x06
	authCodeLength   = 16
	authTypeMask     = 0x0f
)

type v15Header struct {
	authType  byte
	seq       uint32
	sessionID uint32
	authCode  [authCodeLength]byte
}

// decodeV15 splits an IPMI 1.5 session packet (after the RMCP header) into
// its header and IPMI message. Trailing bytes after the message (the legacy
// pad some clients add) are ignored.
func decodeV15(p []byte) (v15Header, []byte, error) {
	var h v15Header
	if len(p) < 10 {
		return h, nil, malformed("IPMI 1.5 session header needs 10 bytes, got %d", len(p))
	}
	h.authType = p[0]
	h.seq = binary.LittleEndian.Uint32(p[1:])
	h.sessionID = binary.LittleEndian.Uint32(p[5:])
	rest := p[9:]
	if h.authType != authTypeNone {
		if len(rest) < authCodeLength+1 {
			return h, nil, malformed("IPMI 1.5 auth code truncated")
		}
		copy(h.authCode[:], rest)
		rest = rest[authCodeLength:]
	}
	n := int(rest[0])
	if len(rest)-1 < n {
		return h, nil, malformed("IPMI 1.5 message length %d exceeds the %d bytes left", n, len(rest)-1)
	}
	return h, rest[1 : 1+n], nil
}

// encodeV15 builds a complete RMCP packet with an IPMI 1.5 session header.
func encodeV15(h v15Header, msg []byte) []byte {
	p := rmcpHeader(rmcpClassIPMI)
	p = append(p, h.authType)
	p = binary.LittleEndian.AppendUint32(p, h.seq)
	p = binary.LittleEndian.AppendUint32(p, h.sessionID)
	if h.authType != authTypeNone {
		p = append(p, h.authCode[:]...)
	}
	p = append(p, byte(len(msg)))
	return append(p, msg...)
}

// IPMI 2.0 / RMCP+ session header (spec 13.6, 13.28).
const (
	payloadIPMI                = 0x00
	payloadOpenSessionRequest  = 0x10
	payloadOpenSessionResponse = 0x11
	payloadRAKP1               = 0x12
	payloadRAKP2               = 0x13
	payloadRAKP3               = 0x14
	payloadRAKP4               = 0x15

	payloadEncrypted     = 0x80
	payloadAuthenticated = 0x40
	payloadTypeMask      = 0x3f
	payloadOEMExplicit   = 0x02

	v20HeaderLength = 12
	nextHeaderRMCP  = 0x07
)

type v20Header struct {
	payloadType   byte
	encrypted     bool
	authenticated bool
	sessionID     uint32
	seq           uint32
}

// decodeV20 splits an RMCP+ packet (after the RMCP header, starting at the
// auth type byte) into header, payload and the session trailer.
func decodeV20(p []byte) (h v20Header, payload, trailer []byte, err error) {
	if len(p) < v20HeaderLength {
		return h, nil, nil, malformed("RMCP+ session header needs %d bytes, got %d", v20HeaderLength, len(p))
	}
	if p[0] != authTypeRMCPPlus {
		return h, nil, nil, malformed("auth type %#x is not RMCP+", p[0])
	}
	h.payloadType = p[1] & payloadTypeMask
	h.encrypted = p[1]&payloadEncrypted != 0
	h.authenticated = p[1]&payloadAuthenticated != 0
	if h.payloadType == payloadOEMExplicit {
		return h, nil, nil, malformed("OEM explicit payloads are not supported")
	}
	h.sessionID = binary.LittleEndian.Uint32(p[2:])
	h.seq = binary.LittleEndian.Uint32(p[6:])
	n := int(binary.LittleEndian.Uint16(p[10:]))
	if len(p)-v20HeaderLength < n {
		return h, nil, nil, malformed("RMCP+ payload length %d exceeds the %d bytes left", n, len(p)-v20HeaderLength)
	}
	return h, p[v20HeaderLength : v20HeaderLength+n], p[v20HeaderLength+n:], nil
}

// appendV20Header appends the RMCP header and RMCP+ session header.
func appendV20Header(p []byte, h v20Header, payloadLength int) []byte {
	p = append(p, rmcpHeader(rmcpClassIPMI)...)
	flags := h.payloadType
	if h.encrypted {
		flags |= payloadEncrypted
	}
	if h.authenticated {
		flags |= payloadAuthenticated
	}
	p = append(p, authTypeRMCPPlus, flags)
	p = binary.LittleEndian.AppendUint32(p, h.sessionID)
	p = binary.LittleEndian.AppendUint32(p, h.seq)
	return binary.LittleEndian.AppendUint16(p, uint16(payloadLength))
}
