package vmidentity

import (
	"fmt"
	"net"
	"strings"
)

// MACRange is an inclusive range of locally administered unicast MAC
// addresses, all sharing their first octet (a range crossing it would hold
// multicast or universally administered addresses).
type MACRange struct {
	first, last uint64
}

// ParseMACRange parses "START-END", two colon-separated 6-octet MACs, e.g.
// "02:00:00:00:00:00-02:00:00:ff:ff:ff".
func ParseMACRange(s string) (MACRange, error) {
	start, end, ok := strings.Cut(s, "-")
	if !ok || strings.Contains(end, "-") {
		return MACRange{}, fmt.Errorf("MAC range %q: want START-END, two colon-separated MACs such as 02:00:00:00:00:00-02:00:00:ff:ff:ff", s)
	}
	first, err := parseLocalMAC(start)
	if err != nil {
		return MACRange{}, fmt.Errorf("MAC range %q: start: %w", s, err)
	}
	last, err := parseLocalMAC(end)
	if err != nil {
		return MACRange{}, fmt.Errorf("MAC range %q: end: %w", s, err)
	}
	if first > last {
		return MACRange{}, fmt.Errorf("MAC range %q: start is after end", s)
	}
	if first>>40 != last>>40 {
		return MACRange{}, fmt.Errorf("MAC range %q: start and end must share their first octet, else the range holds multicast or universally administered addresses", s)
	}
	return MACRange{first: first, last: last}, nil
}

func parseLocalMAC(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	hw, err := net.ParseMAC(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a MAC address: %w", s, err)
	}
	if len(hw) != 6 || strings.Count(s, ":") != 5 {
		return 0, fmt.Errorf("%q is not a colon-separated 6-octet MAC address", s)
	}
	if hw[0]&0x01 != 0 {
		return 0, fmt.Errorf("%s is a multicast address (first octet's lowest bit set)", hw)
	}
	if hw[0]&0x02 == 0 {
		return 0, fmt.Errorf("%s is not locally administered (first octet's second bit clear, e.g. 02:...)", hw)
	}
	var v uint64
	for _, b := range hw {
		v = v<<8 | uint64(b)
	}
	return v, nil
}

// String is the range as ParseMACRange reads it.
func (r MACRange) String() string { return macString(r.first) + "-" + macString(r.last) }

// size is the number of addresses in the range; zero for the zero MACRange.
func (r MACRange) size() uint64 {
	if r.first == 0 && r.last == 0 {
		return 0
	}
	return r.last - r.first + 1
}

// at is the address offset (modulo the size) from the range's start.
func (r MACRange) at(offset uint64) string { return macString(r.first + offset%r.size()) }

func macString(v uint64) string {
	hw := make(net.HardwareAddr, 6)
	for i := 5; i >= 0; i-- {
		hw[i] = byte(v)
		v >>= 8
	}
	return hw.String()
}
