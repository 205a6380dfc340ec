package schemacheck_test

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

var (
	sharedValidatorOnce sync.Once
	sharedValidator     *schemacheck.Validator
	sharedValidatorErr  error
)

// bundleValidator shares one Validator (and its compiled schemas) between
// tests; compiling is the slow part.
func bundleValidator(t *testing.T) *schemacheck.Validator {
	t.Helper()
	dir := schemacheck.RequireBundle(t)
	sharedValidatorOnce.Do(func() {
		sharedValidator, sharedValidatorErr = schemacheck.NewValidator(filepath.Join(dir, "json-schema"))
	})
	if sharedValidatorErr != nil {
		t.Fatal(sharedValidatorErr)
	}
	return sharedValidator
}

func joinViolations(violations []schemacheck.Violation) string {
	var sb strings.Builder
	for _, v := range violations {
		sb.WriteString("  " + v.String() + "\n")
	}
	return sb.String()
}
