package vmidentity

import (
	"strings"
	"testing"
)

func TestParseMACRange(t *testing.T) {
	tests := []struct {
		in        string
		want      string // String() of the parsed range
		wantSize  uint64
		wantError string
	}{
		{in: "02:00:00:00:00:00-02:00:00:ff:ff:ff", want: "02:00:00:00:00:00-02:00:00:ff:ff:ff", wantSize: 1 << 24},
		{in: "0A:00:00:00:00:10 - 0A:00:00:00:00:10", want: "0a:00:00:00:00:10-0a:00:00:00:00:10", wantSize: 1},
		{in: "fe:ff:ff:ff:ff:00-fe:ff:ff:ff:ff:ff", want: "fe:ff:ff:ff:ff:00-fe:ff:ff:ff:ff:ff", wantSize: 256},
		{in: "", wantError: "want START-END"},
		{in: "02:00:00:00:00:00", wantError: "want START-END"},
		{in: "02-00-00-00-00-00-02-00-00-00-00-ff", wantError: "want START-END"},
		{in: "02:00:00:00:00:00-", wantError: "end: \"\" is not a MAC address"},
		{in: "zz:00:00:00:00:00-02:00:00:00:00:01", wantError: "start: \"zz:00:00:00:00:00\" is not a MAC address"},
		{in: "0200.0000.0000-0200.0000.00ff", wantError: "not a colon-separated 6-octet MAC"},
		{in: "00:00:00:00:00:00:00:00-00:00:00:00:00:00:00:ff", wantError: "not a colon-separated 6-octet MAC"},
		{in: "00:16:3e:00:00:00-00:16:3e:ff:ff:ff", wantError: "not locally administered"},
		{in: "03:00:00:00:00:00-03:00:00:00:00:ff", wantError: "multicast"},
		{in: "02:00:00:00:00:00-01:00:00:00:00:ff", wantError: "end: 01:00:00:00:00:ff is a multicast"},
		{in: "02:00:00:00:01:00-02:00:00:00:00:ff", wantError: "start is after end"},
		{in: "02:00:00:00:00:00-06:00:00:00:00:00", wantError: "share their first octet"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			r, err := ParseMACRange(tc.in)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("ParseMACRange(%q) = %v, %v; want error containing %q", tc.in, r, err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMACRange(%q): %v", tc.in, err)
			}
			if r.String() != tc.want || r.size() != tc.wantSize {
				t.Fatalf("ParseMACRange(%q) = %s (size %d), want %s (size %d)", tc.in, r, r.size(), tc.want, tc.wantSize)
			}
		})
	}
}

func TestMACRangeAtWrapsAround(t *testing.T) {
	r, err := ParseMACRange("02:00:00:00:00:fe-02:00:00:00:01:01")
	if err != nil {
		t.Fatal(err)
	}
	for offset, want := range []string{"02:00:00:00:00:fe", "02:00:00:00:00:ff", "02:00:00:00:01:00", "02:00:00:00:01:01", "02:00:00:00:00:fe"} {
		if got := r.at(uint64(offset)); got != want {
			t.Errorf("at(%d) = %s, want %s", offset, got, want)
		}
	}
}

// FuzzParseMACRange: any input is either refused with an error or parses
// to a non-empty range of locally administered unicast addresses that
// prints back to itself.
func FuzzParseMACRange(f *testing.F) {
	for _, seed := range []string{"02:00:00:00:00:00-02:00:00:ff:ff:ff", "02:00:00:00:00:00", "-", "03:00:00:00:00:00-03:00:00:00:00:01", "02-00-00-00-00-00-02-00-00-00-00-01"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseMACRange(s)
		if err != nil {
			return
		}
		if r.size() == 0 {
			t.Fatalf("ParseMACRange(%q) = empty range", s)
		}
		for _, mac := range []string{r.at(0), r.at(r.size() - 1)} {
			if _, err := parseLocalMAC(mac); err != nil {
				t.Fatalf("ParseMACRange(%q) holds %s: %v", s, mac, err)
			}
		}
		again, err := ParseMACRange(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseMACRange(%q).String() = %q does not parse back: %v, %v", s, r, again, err)
		}
	})
}
