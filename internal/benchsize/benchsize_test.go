package benchsize

import (
	"slices"
	"testing"
)

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Helper()               {}
func (f *fatalRecorder) Fatalf(string, ...any) { f.failed = true }

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name, value string
		want        []int
		fails       bool
	}{
		{"unset", "", []int{1000, 10000}, false},
		{"one size", "10", []int{10}, false},
		{"several, spaced", "1, 10,100", []int{1, 10, 100}, false},
		{"zero", "0", nil, true},
		{"negative", "-5", nil, true},
		{"not a number", "10,many", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("BENCHSIZE_TEST", tt.value)
			rec := &fatalRecorder{TB: t}
			got := FromEnv(rec, "BENCHSIZE_TEST", 1000, 10000)
			if rec.failed != tt.fails {
				t.Fatalf("failed = %v, want %v", rec.failed, tt.fails)
			}
			if !tt.fails && !slices.Equal(got, tt.want) {
				t.Errorf("sizes = %v, want %v", got, tt.want)
			}
		})
	}
}
