// Command promql reads a JSON array of PromQL expressions on stdin and prints, for each, the
// metric names its selectors name and their label matchers, or the parse error, as
// Prometheus's own parser reads it (github.com/prometheus/prometheus/promql/parser).
// tests/test_monitoring.py runs it on the dashboard's targets and the alerts' expressions.
//
// `promql test-rules FILE...` runs unit tests of alerting rules instead (rules.go).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Result is what one expression selects: metric names, and for each the functions applied
// directly to its range (rate, increase...), so the caller can check counters get rates.
type Result struct {
	Expr      string              `json:"expr"`
	Names     []string            `json:"names"`
	RangedBy  map[string][]string `json:"rangedBy"`
	Selectors []Selector          `json:"selectors"`
	Error     string              `json:"error,omitempty"`
}

// Selector is one vector selector: its metric name and its other label matchers, so the
// caller can check them against the labels a real scrape carries.
type Selector struct {
	Name     string    `json:"name"`
	Matchers []Matcher `json:"matchers"`
}

// Matcher is a label matcher as written: label, operator (=, !=, =~, !~) and value.
type Matcher struct {
	Label string `json:"label"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

func analyse(promql parser.Parser, expression string) Result {
	result := Result{
		Expr: expression, Names: []string{}, RangedBy: map[string][]string{}, Selectors: []Selector{},
	}
	expr, err := promql.ParseExpr(expression)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			name := selectorName(n)
			if name != "" && !seen[name] {
				seen[name] = true
				result.Names = append(result.Names, name)
			}
			selector := Selector{Name: name, Matchers: []Matcher{}}
			for _, m := range n.LabelMatchers {
				if m.Name != labels.MetricName {
					selector.Matchers = append(selector.Matchers, Matcher{m.Name, m.Type.String(), m.Value})
				}
			}
			result.Selectors = append(result.Selectors, selector)
		case *parser.Call:
			for _, arg := range n.Args {
				if ms, ok := arg.(*parser.MatrixSelector); ok {
					if vs, ok := ms.VectorSelector.(*parser.VectorSelector); ok {
						name := selectorName(vs)
						result.RangedBy[name] = append(result.RangedBy[name], n.Func.Name)
					}
				}
			}
		}
		return nil
	})
	sort.Strings(result.Names)
	return result
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "test-rules" {
		os.Exit(testRules(os.Args[2:]))
	}
	input, err := io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
	if err != nil {
		fmt.Fprintln(os.Stderr, "promql: reading stdin:", err)
		os.Exit(2)
	}
	var expressions []string
	if err := json.Unmarshal(input, &expressions); err != nil {
		fmt.Fprintln(os.Stderr, "promql: stdin is not a JSON array of strings:", err)
		os.Exit(2)
	}
	// The default options: what a Prometheus server accepts without feature flags.
	promql := parser.NewParser(parser.Options{})
	results := make([]Result, 0, len(expressions))
	for _, expression := range expressions {
		results = append(results, analyse(promql, expression))
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promql: writing stdout:", err)
		os.Exit(2)
	}
}
