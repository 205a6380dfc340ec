// Command chartgen writes the generated files of the Helm chart in the
// folder it is given (go generate in deploy/helm runs it on virtmetal/).
package main

import (
	"fmt"
	"os"

	"github.com/virtmetal/virtmetal/deploy/helm"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: chartgen CHART_DIR")
		os.Exit(2)
	}
	if err := helm.Generate(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
}
