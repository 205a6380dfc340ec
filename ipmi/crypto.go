package ipmi

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"hash"
)

// RMCP+ algorithm numbers (spec 13.28, tables 13-17 to 13-19).
const (
	authRAKPNone       = 0x00
	authRAKPHMACSHA1   = 0x01
	authRAKPHMACSHA256 = 0x03

	integrityNone          = 0x00
	integrityHMACSHA1_96   = 0x01
	integrityHMACSHA256128 = 0x04

	confidentialityNone      = 0x00
	confidentialityAESCBC128 = 0x01
)

// cipherSuite is one of the standard cipher suites (spec table 22-20).
type cipherSuite struct {
	id              byte
	auth            byte
	integrity       byte
	confidentiality byte
}

// knownCipherSuites are the suites this package can run; Config picks the
// ones a server offers.
var knownCipherSuites = []cipherSuite{
	{0, authRAKPNone, integrityNone, confidentialityNone},
	{1, authRAKPHMACSHA1, integrityNone, confidentialityNone},
	{2, authRAKPHMACSHA1, integrityHMACSHA1_96, confidentialityNone},
	{3, authRAKPHMACSHA1, integrityHMACSHA1_96, confidentialityAESCBC128},
	{15, authRAKPHMACSHA256, integrityNone, confidentialityNone},
	{16, authRAKPHMACSHA256, integrityHMACSHA256128, confidentialityNone},
	{17, authRAKPHMACSHA256, integrityHMACSHA256128, confidentialityAESCBC128},
}

// authHash is the hash behind a RAKP authentication algorithm; nil for
// RAKP-none.
func authHash(alg byte) func() hash.Hash {
	switch alg {
	case authRAKPHMACSHA1:
		return sha1.New
	case authRAKPHMACSHA256:
		return sha256.New
	}
	return nil
}

// rakpHMAC is HMAC over the concatenation of parts; nil for RAKP-none.
func rakpHMAC(alg byte, key []byte, parts ...[]byte) []byte {
	h := authHash(alg)
	if h == nil {
		return nil
	}
	mac := hmac.New(h, key)
	for _, p := range parts {
		mac.Write(p)
	}
	return mac.Sum(nil)
}

// rakp4ICVLength is how much of HMAC_SIK(Rm, SIDc, GUIDc) RAKP 4 carries.
func rakp4ICVLength(alg byte) int {
	switch alg {
	case authRAKPHMACSHA1:
		return 12
	case authRAKPHMACSHA256:
		return 16
	}
	return 0
}

// integrityLength is the length of the session trailer's AuthCode.
func integrityLength(alg byte) int {
	switch alg {
	case integrityHMACSHA1_96:
		return 12
	case integrityHMACSHA256128:
		return 16
	}
	return 0
}

func integrityHash(alg byte) func() hash.Hash {
	if alg == integrityHMACSHA256128 {
		return sha256.New
	}
	return sha1.New
}

// sessionKeys are the keys derived from the session integrity key (SIK):
// K1 for integrity and K2 (its first 16 bytes) for AES (spec 13.32).
type sessionKeys struct {
	suite cipherSuite
	k1    []byte
	k2    []byte
}

// deriveKeys computes SIK = HMAC_Kg(Rm | Rc | ROLEm | ULENGTHm | UNAMEm)
// and K1, K2 from it. Kg is the user's password: this BMC has no BMC key.
func deriveKeys(suite cipherSuite, password []byte, rm, rc []byte, role byte, username []byte) (sik []byte, keys sessionKeys) {
	sik = rakpHMAC(suite.auth, password, rm, rc, []byte{role, byte(len(username))}, username)
	keys.suite = suite
	if sik == nil {
		return nil, keys
	}
	// The constants are 20 bytes for every hash: the specification
	// predates SHA-256 and ipmitool and freeipmi both kept 20.
	keys.k1 = rakpHMAC(suite.auth, sik, constantBytes(1, keyConstantLength))
	keys.k2 = rakpHMAC(suite.auth, sik, constantBytes(2, keyConstantLength))
	return sik, keys
}

const keyConstantLength = 20

func constantBytes(b byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = b
	}
	return p
}

// seal builds a complete RMCP+ packet: it encrypts the payload and appends
// the integrity trailer as the suite requires.
func (k sessionKeys) seal(payloadType byte, sessionID, seq uint32, payload []byte) []byte {
	h := v20Header{payloadType: payloadType, sessionID: sessionID, seq: seq}
	if k.suite.confidentiality == confidentialityAESCBC128 {
		h.encrypted = true
		payload = encryptAESCBC(k.k2[:aes.BlockSize], payload)
	}
	icvLen := integrityLength(k.suite.integrity)
	h.authenticated = icvLen > 0
	p := appendV20Header(make([]byte, 0, 64+len(payload)), h, len(payload))
	p = append(p, payload...)
	if !h.authenticated {
		return p
	}
	// The pad makes the signed range (auth type through next header) a
	// multiple of four bytes.
	signedStart := rmcpHeaderLength
	pad := (4 - (len(p)-signedStart+2)%4) % 4
	for range pad {
		p = append(p, 0xff)
	}
	p = append(p, byte(pad), nextHeaderRMCP)
	mac := hmac.New(integrityHash(k.suite.integrity), k.k1)
	mac.Write(p[signedStart:])
	return append(p, mac.Sum(nil)[:icvLen]...)
}

// verifyTrailer checks the session trailer of an authenticated packet;
// signed is the packet from the auth type byte to its end.
func (k sessionKeys) verifyTrailer(signed, trailer []byte) bool {
	icvLen := integrityLength(k.suite.integrity)
	if icvLen == 0 || len(trailer) < icvLen+2 {
		return false
	}
	padLen := int(trailer[len(trailer)-icvLen-2])
	if trailer[len(trailer)-icvLen-1] != nextHeaderRMCP || len(trailer) != padLen+2+icvLen {
		return false
	}
	mac := hmac.New(integrityHash(k.suite.integrity), k.k1)
	mac.Write(signed[:len(signed)-icvLen])
	return hmac.Equal(mac.Sum(nil)[:icvLen], signed[len(signed)-icvLen:])
}

// open decrypts an encrypted payload (a no-op for suites without
// confidentiality).
func (k sessionKeys) open(payload []byte) ([]byte, error) {
	if k.suite.confidentiality != confidentialityAESCBC128 {
		return payload, nil
	}
	return decryptAESCBC(k.k2[:aes.BlockSize], payload)
}

// encryptAESCBC returns IV | ciphertext of data followed by the pad bytes
// 1, 2, ..., n and the pad length n (spec 13.29).
func encryptAESCBC(key, data []byte) []byte {
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // the key is always 16 bytes
	}
	pad := (aes.BlockSize - (len(data)+1)%aes.BlockSize) % aes.BlockSize
	out := make([]byte, aes.BlockSize, aes.BlockSize+len(data)+pad+1)
	rand.Read(out[:aes.BlockSize])
	out = append(out, data...)
	for i := range pad {
		out = append(out, byte(i+1))
	}
	out = append(out, byte(pad))
	cipher.NewCBCEncrypter(block, out[:aes.BlockSize]).CryptBlocks(out[aes.BlockSize:], out[aes.BlockSize:])
	return out
}

func decryptAESCBC(key, payload []byte) ([]byte, error) {
	if len(payload) < 2*aes.BlockSize || len(payload)%aes.BlockSize != 0 {
		return nil, malformed("AES-CBC payload length %d", len(payload))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // the key is always 16 bytes
	}
	plain := make([]byte, len(payload)-aes.BlockSize)
	cipher.NewCBCDecrypter(block, payload[:aes.BlockSize]).CryptBlocks(plain, payload[aes.BlockSize:])
	pad := int(plain[len(plain)-1])
	if pad >= aes.BlockSize || pad+1 > len(plain) {
		return nil, malformed("AES-CBC pad length %d", pad)
	}
	for i, b := range plain[len(plain)-1-pad : len(plain)-1] {
		if int(b) != i+1 {
			return nil, malformed("AES-CBC pad byte %d", i)
		}
	}
	return plain[:len(plain)-1-pad], nil
}

// authCodeV15 is the IPMI 1.5 AuthCode of a message (spec 22.17.1): the
// password itself for straight password, MD5(password | session ID |
// message | sequence | password) for MD5. password is padded to 16 bytes.
func authCodeV15(authType byte, password [authCodeLength]byte, sessionID, seq uint32, msg []byte) [authCodeLength]byte {
	if authType == authTypePassword {
		return password
	}
	h := md5.New()
	h.Write(password[:])
	h.Write(binary.LittleEndian.AppendUint32(nil, sessionID))
	h.Write(msg)
	h.Write(binary.LittleEndian.AppendUint32(nil, seq))
	h.Write(password[:])
	var code [authCodeLength]byte
	copy(code[:], h.Sum(nil))
	return code
}

func equalConstantTime(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
