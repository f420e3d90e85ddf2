// Command promql reads a JSON array of PromQL expressions on stdin and prints, for each, the
// metric names its selectors name, or the parse error, as Prometheus's own parser reads it
// (github.com/prometheus/prometheus/promql/parser). tests/test_monitoring.py runs it on the
// dashboard's targets and the alerts' expressions.
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
	Expr     string              `json:"expr"`
	Names    []string            `json:"names"`
	RangedBy map[string][]string `json:"rangedBy"`
	Error    string              `json:"error,omitempty"`
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
	result := Result{Expr: expression, Names: []string{}, RangedBy: map[string][]string{}}
	expr, err := promql.ParseExpr(expression)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			if name := selectorName(n); name != "" && !seen[name] {
				seen[name] = true
				result.Names = append(result.Names, name)
			}
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
