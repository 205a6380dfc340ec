// Package benchsize reads the sizes a benchmark runs at from the
// environment: a full run takes the sizes, hack/test.sh's one-shot
// run small ones that still go through the same code.
package benchsize

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// FromEnv returns the positive counts listed, comma-separated, in the
// environment variable name, or defaults when it is unset or empty. A list
// that does not parse fails the benchmark rather than running other sizes.
func FromEnv(tb testing.TB, name string, defaults ...int) []int {
	tb.Helper()
	list := os.Getenv(name)
	if list == "" {
		return defaults
	}
	var sizes []int
	for field := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			tb.Fatalf("%s=%q: want positive counts separated by commas", name, list)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
