package machine

import "fmt"

// Errorf wraps one of this package's sentinels with a formatted detail, so
// errors.Is still finds the sentinel.
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
