package cli

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The CLI is a client: flags, one call to the service (or the API's view
// of it), output. Its code imports smx's service-level packages only; a
// lower layer it needs is re-exported by the service (service/reexport.go).
// supervisor is here for one call: the hidden __supervise command hands the
// process to supervisor.Main, since the supervisor is this same binary.
func TestCLIImportsServiceLevelOnly(t *testing.T) {
	allowed := map[string]bool{
		"github.com/smx-dev/smx/api":                 true,
		"github.com/smx-dev/smx/internal/api":        true,
		"github.com/smx-dev/smx/internal/console":    true,
		"github.com/smx-dev/smx/internal/errdefs":    true,
		"github.com/smx-dev/smx/internal/mcpserver":  true,
		"github.com/smx-dev/smx/internal/service":    true,
		"github.com/smx-dev/smx/internal/supervisor": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(p, "github.com/smx-dev/smx/") && !allowed[p] {
				t.Errorf("%s imports %s: reach it through the service (re-export it in internal/service/reexport.go)", f, p)
			}
		}
	}
}
