// Package conformance checks a Redfish service against what DMTF's
// validators check: the JSON schema of every resource and error body,
// $metadata and the OData service document, annotations, collection counts,
// allowable values, links, the protocol rules of DSP0266 and the session
// life cycle. It runs against any Redfish URL: the tests point it at an
// in-process virtmetal server, cmd/redfish-conformance at a live BMC.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

// Outcome is how a rule fared on one URI.
type Outcome string

const (
	Pass Outcome = "pass"
	// Warn is a deviation DSP0266 tolerates (a "should"), or a check the
	// service's answers did not allow to run in full.
	Warn Outcome = "warn"
	Fail Outcome = "fail"
)

// Result is one rule checked on one URI.
type Result struct {
	Rule    string  `json:"rule"`
	URI     string  `json:"uri,omitempty"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason,omitempty"`
}

// Target is the service under test.
type Target struct {
	// BaseURL is scheme://host[:port] of the service, without a path.
	BaseURL string
	// Client sends every request; it carries the TLS settings.
	Client   *http.Client
	Username string
	Password string
	// SchemaDir is the DMTF bundle folder holding json-schema/ and csdl/.
	SchemaDir string
	// Writes allows the checks that change the service: a PATCH of the
	// Boot object that writes back the value it read, an SSE stream held
	// open, a push subscription (deleted at the end) and a test event.
	// Without it only reads and a login session (deleted at the end) are
	// sent.
	Writes bool
	// EventListenAddress is where the receiver of the push subscription
	// the suite makes (with writes allowed) listens, host:port, an address
	// the service can reach, as the subscription's Destination names it.
	// Default 127.0.0.1:0, used only when BaseURL is on loopback too (a
	// service elsewhere would POST to its own loopback); otherwise no push
	// subscription is made.
	EventListenAddress string
	// EventTimeout bounds the wait for a submitted test event (default
	// 10 s).
	EventTimeout time.Duration
	// Validator, when set, is reused instead of compiling the bundle's
	// schemas again; runs against several services share one.
	Validator *schemacheck.Validator
}

// Report is the outcome of a run.
type Report struct {
	Target  string   `json:"target"`
	Results []Result `json:"results"`
	// NotRun names the rules left out, with why.
	NotRun []string `json:"notRun,omitempty"`
}

// Counts returns how many results passed, warned and failed.
func (r *Report) Counts() (pass, warn, fail int) {
	for _, res := range r.Results {
		switch res.Outcome {
		case Pass:
			pass++
		case Warn:
			warn++
		case Fail:
			fail++
		}
	}
	return pass, warn, fail
}

// Failed reports whether any rule failed.
func (r *Report) Failed() bool {
	_, _, fail := r.Counts()
	return fail > 0
}

// Failures returns the failed results.
func (r *Report) Failures() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Outcome == Fail {
			out = append(out, res)
		}
	}
	return out
}

// WriteSummary prints pass/warn/fail per rule, then every warning and
// failure with its URI and reason.
func (r *Report) WriteSummary(w io.Writer) error {
	type tally struct{ pass, warn, fail int }
	byRule := map[string]*tally{}
	var rules []string
	for _, res := range r.Results {
		t, ok := byRule[res.Rule]
		if !ok {
			t = &tally{}
			byRule[res.Rule] = t
			rules = append(rules, res.Rule)
		}
		switch res.Outcome {
		case Pass:
			t.pass++
		case Warn:
			t.warn++
		case Fail:
			t.fail++
		}
	}
	sort.Strings(rules)
	var b strings.Builder
	fmt.Fprintf(&b, "Redfish conformance of %s\n\n", r.Target)
	fmt.Fprintf(&b, "%-28s %6s %6s %6s\n", "rule", "pass", "warn", "fail")
	for _, rule := range rules {
		t := byRule[rule]
		fmt.Fprintf(&b, "%-28s %6d %6d %6d\n", rule, t.pass, t.warn, t.fail)
	}
	pass, warn, fail := r.Counts()
	fmt.Fprintf(&b, "%-28s %6d %6d %6d\n", "total", pass, warn, fail)
	for _, outcome := range []Outcome{Fail, Warn} {
		for _, res := range r.Results {
			if res.Outcome == outcome {
				fmt.Fprintf(&b, "\n%s %s %s\n    %s", strings.ToUpper(string(outcome)), res.Rule, res.URI, res.Reason)
			}
		}
	}
	for _, n := range r.NotRun {
		fmt.Fprintf(&b, "\nnot run: %s", n)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Run checks the target. An error means the run could not go on (the
// service is unreachable, the schema bundle is incomplete); everything the
// service does wrong is a failed Result.
func Run(ctx context.Context, t Target) (*Report, error) {
	if t.Client == nil {
		return nil, errors.New("conformance: Target.Client is nil")
	}
	validator := t.Validator
	if validator == nil {
		var err error
		if validator, err = schemacheck.NewValidator(filepath.Join(t.SchemaDir, "json-schema")); err != nil {
			return nil, fmt.Errorf("conformance: %w", err)
		}
	}
	s := &session{target: t, validator: validator, report: &Report{Target: t.BaseURL}}
	var steps []func(context.Context) error
	if t.Writes {
		// Before the crawl, so that it walks the members they make.
		steps = append(steps, s.openEventSources)
		defer s.closeEventSources(context.WithoutCancel(ctx))
	} else {
		s.report.NotRun = append(s.report.NotRun, "subscriptions: an SSE stream, a push subscription and a test event (needs writes allowed)")
	}
	steps = append(steps,
		s.crawl,
		s.checkMetadata,
		s.checkServiceDocument,
		s.checkResources,
		s.checkProtocolRules,
		s.checkErrorBodies,
		s.checkRoles,
		s.checkAccounts,
		s.checkSessionLifeCycle,
	)
	if t.Writes {
		steps = append(steps, s.checkSubscriptions, s.checkPatch)
	} else {
		s.report.NotRun = append(s.report.NotRun, "patch: PATCH body and If-Match (needs writes allowed)")
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return s.report, nil
}

// session is one run's state.
type session struct {
	target    Target
	validator *schemacheck.Validator
	report    *Report
	// visited lists the URIs the crawl fetched, and odataTypes the types
	// it saw.
	visited    []string
	odataTypes []string
	// events holds the event sources the run opened, nil when none.
	events *eventSources
}

func (s *session) add(rule, uri string, outcome Outcome, reason string) {
	s.report.Results = append(s.report.Results, Result{Rule: rule, URI: uri, Outcome: outcome, Reason: reason})
}

func (s *session) pass(rule, uri string) { s.add(rule, uri, Pass, "") }

func (s *session) fail(rule, uri, format string, args ...any) {
	s.add(rule, uri, Fail, fmt.Sprintf(format, args...))
}

// check records a pass when problems is empty and a failure per problem
// otherwise.
func (s *session) check(rule, uri string, problems []string) {
	if len(problems) == 0 {
		s.pass(rule, uri)
		return
	}
	for _, p := range problems {
		s.fail(rule, uri, "%s", p)
	}
}
