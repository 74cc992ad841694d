package api_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/smx-dev/smx/internal/testutil"
)

// field is one JSON field of a wire type as one side declares it.
type field struct {
	Required bool   // always present (Go: no omitempty/omitzero)
	Type     string // string, integer, boolean, number, object, any, array<T>, ref:Name
}

// shape is a wire type's fields by JSON name.
type shape map[string]field

// TestOneSchema holds the three declarations of the API's JSON against
// one another, field by field: api/openapi.yaml's component schemas, the
// Go wire types in package api (which the server and the Go client share),
// the Go client's own names for them, and the Python client's TypedDicts
// (python/src/smx/types.py). A field (or a type) added to one and not to
// the others fails it, as does a required field that one side may leave
// out, or a type that differs. It is generic over every schema in the
// document: a new route's types are checked as soon as they are added.
//
// It also reads how the Python client builds request bodies (every
// _body(Kind, ...) call): each key must be a field of Kind, together the
// calls must be able to send every field of each Kind they send, a
// parameter's default must be the wire's own (absent: None, False, 0, "")
// so that a Python call means what the same Go call means, and the sync
// and asyncio clients must offer the same methods and parameters.
func TestOneSchema(t *testing.T) {
	doc, _ := openAPI(t)
	schemas := map[string]shape{}
	for name, ref := range doc.Components.Schemas {
		schemas[name] = schemaShape(ref.Value)
		for f, p := range ref.Value.Properties {
			if v := p.Value; p.Ref == "" && (v.Type.Is("object") && len(v.Properties) > 0 ||
				v.Type.Is("array") && v.Items.Ref == "" && len(v.Items.Value.Properties) > 0) {
				t.Errorf("api/openapi.yaml: %s.%s is an inline object: make it a component schema named as its Go type, so every side can be held to it", name, f)
			}
		}
	}
	goTypes := parseGoTypes(t, filepath.Join(testutil.RepoRoot(), "api"), "")

	t.Run("go", func(t *testing.T) {
		compareAll(t, "api/openapi.yaml", schemas, "package api", goTypes)
	})

	t.Run("go client", func(t *testing.T) {
		// The client names the api types (type X = api.X); a struct of its
		// own under a schema's name is held to the schema too.
		dir := filepath.Join(testutil.RepoRoot(), "client")
		own := parseGoTypes(t, dir, "")
		aliases := parseGoTypes(t, dir, "api")
		for name := range schemas {
			if s, ok := own[name]; ok {
				compare(t, name, "api/openapi.yaml", schemas[name], "package client", s)
			}
		}
		for name, s := range aliases {
			if s == nil {
				continue
			}
			if _, ok := schemas[name]; !ok {
				t.Errorf("package client: %s aliases a type the schema does not have", name)
			}
		}
		for name, target := range clientAliasTargets(t, dir) {
			if name != target {
				t.Errorf("package client: %s = api.%s: a wire type under another name", name, target)
			}
		}
	})

	py, err := exec.LookPath("python3")
	testutil.Require(t, err == nil, "python3", "apt-get install python3")
	src := filepath.Join(testutil.RepoRoot(), "python", "src")
	cmd := exec.Command(py, filepath.Join("testdata", "pyschema.py"),
		filepath.Join(src, "smx", "client.py"), filepath.Join(src, "smx", "aio.py"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 testdata/pyschema.py: %v", err)
	}
	var pyOut struct {
		Types       map[string]shape
		Sync, Async map[string][][]string
		Bodies      []struct {
			File, Func, Kind string
			Line             int
			Keys             map[string]struct {
				Param      string
				Default    any
				HasDefault bool `json:"has_default"`
			}
		}
	}
	if err := json.Unmarshal(out, &pyOut); err != nil {
		t.Fatal(err)
	}

	t.Run("python", func(t *testing.T) {
		compareAll(t, "api/openapi.yaml", schemas, "python smx.types", pyOut.Types)
	})

	t.Run("python sync and asyncio", func(t *testing.T) {
		// The two Python clients offer the same methods with the same
		// parameters, so a field one can send the other can too.
		for _, m := range sortedKeys(pyOut.Sync) {
			if a, ok := pyOut.Async[m]; !ok {
				t.Errorf("smx.AsyncClient has no %s", m)
			} else if !reflect.DeepEqual(a, pyOut.Sync[m]) {
				t.Errorf("%s: Client's parameters %v, AsyncClient's %v", m, pyOut.Sync[m], a)
			}
		}
		for _, m := range sortedKeys(pyOut.Async) {
			if _, ok := pyOut.Sync[m]; !ok {
				t.Errorf("smx.Client has no %s", m)
			}
		}
	})

	t.Run("python bodies", func(t *testing.T) {
		sent := map[string]map[string]bool{} // kind → keys sent by either client
		for _, b := range pyOut.Bodies {
			where := fmt.Sprintf("%s:%d (%s)", filepath.Base(b.File), b.Line, b.Func)
			s, ok := schemas[b.Kind]
			if !ok {
				t.Errorf("%s: _body(%s, ...): not a schema in api/openapi.yaml", where, b.Kind)
				continue
			}
			k := b.Kind
			if sent[k] == nil {
				sent[k] = map[string]bool{}
			}
			for key, v := range b.Keys {
				sent[k][key] = true
				if _, ok := s[key]; !ok {
					t.Errorf("%s: %s has no field %q", where, b.Kind, key)
				}
				if v.HasDefault && !wireDefault(v.Default) {
					t.Errorf("%s: parameter %s defaults to %v; the wire's %s.%s is absent (None, False, 0 or \"\") unless sent, as in the Go client", where, v.Param, v.Default, b.Kind, key)
				}
			}
		}
		for kind, keys := range sent {
			var missing []string
			for f := range schemas[kind] {
				if !keys[f] {
					missing = append(missing, f)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("the Python client never sends %s's %s", kind, strings.Join(missing, ", "))
			}
		}
	})
}

// wireDefault reports whether a Python parameter default means "not
// sent": None, False, 0 or "".
func wireDefault(v any) bool {
	return v == nil || v == false || v == float64(0) || v == ""
}

func compareAll(t *testing.T, aName string, a map[string]shape, bName string, b map[string]shape) {
	t.Helper()
	for _, name := range sortedKeys(a) {
		s, ok := b[name]
		if !ok {
			t.Errorf("%s has no type %s (in %s)", bName, name, aName)
			continue
		}
		compare(t, name, aName, a[name], bName, s)
	}
	for _, name := range sortedKeys(b) {
		if _, ok := a[name]; !ok {
			t.Errorf("%s has a type %s that %s does not", bName, name, aName)
		}
	}
}

func compare(t *testing.T, typ, aName string, a shape, bName string, b shape) {
	t.Helper()
	for _, f := range sortedKeys(a) {
		g, ok := b[f]
		switch {
		case !ok:
			t.Errorf("%s.%s: in %s, not in %s", typ, f, aName, bName)
		case g.Type != a[f].Type:
			t.Errorf("%s.%s: %s in %s, %s in %s", typ, f, a[f].Type, aName, g.Type, bName)
		case g.Required != a[f].Required:
			t.Errorf("%s.%s: required %v in %s, %v in %s", typ, f, a[f].Required, aName, g.Required, bName)
		}
	}
	for _, f := range sortedKeys(b) {
		if _, ok := a[f]; !ok {
			t.Errorf("%s.%s: in %s, not in %s", typ, f, bName, aName)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// schemaShape is an OpenAPI object schema's fields.
func schemaShape(s *openapi3.Schema) shape {
	out := shape{}
	for f, p := range s.Properties {
		out[f] = field{Required: slices.Contains(s.Required, f), Type: schemaType(p)}
	}
	return out
}

func schemaType(p *openapi3.SchemaRef) string {
	if p.Ref != "" {
		return "ref:" + p.Ref[strings.LastIndex(p.Ref, "/")+1:]
	}
	v := p.Value
	switch {
	case v.Type.Is("array"):
		return "array<" + schemaType(v.Items) + ">"
	case v.Type.Is("object") && len(v.Properties) > 0:
		return "inline"
	case v.Type.Is("object"):
		return "object"
	case v.Type.Is("string"), v.Type.Is("integer"), v.Type.Is("boolean"), v.Type.Is("number"):
		return v.Type.Slice()[0]
	}
	return "any"
}

// parseGoTypes reads the exported struct types with JSON tags declared
// in the Go package in dir. With alias set, it returns instead the names
// declared as aliases of package alias's types (type X = alias.Y), each
// with a nil shape.
func parseGoTypes(t *testing.T, dir, alias string) map[string]shape {
	t.Helper()
	structs := map[string]*ast.StructType{}
	out := map[string]shape{}
	for _, file := range goFiles(t, dir) {
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			if alias != "" {
				if sel, ok := ts.Type.(*ast.SelectorExpr); ok && ts.Assign.IsValid() && fmt.Sprint(sel.X) == alias {
					out[ts.Name.Name] = nil
				}
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				structs[ts.Name.Name] = st
			}
			return true
		})
	}
	if alias != "" {
		return out
	}
	var fields func(st *ast.StructType, into shape)
	fields = func(st *ast.StructType, into shape) {
		for _, f := range st.Fields.List {
			if len(f.Names) == 0 { // embedded: its fields are the outer type's
				if id, ok := f.Type.(*ast.Ident); ok && structs[id.Name] != nil {
					fields(structs[id.Name], into)
				}
				continue
			}
			if f.Tag == nil || !f.Names[0].IsExported() {
				continue
			}
			tag := reflect.StructTag(strings.Trim(f.Tag.Value, "`")).Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" || name == "" {
				continue
			}
			omit := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
			into[name] = field{Required: !omit, Type: goType(f.Type, structs)}
		}
	}
	for name, st := range structs {
		s := shape{}
		fields(st, s)
		if len(s) > 0 {
			out[name] = s
		}
	}
	return out
}

func goType(e ast.Expr, structs map[string]*ast.StructType) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return goType(e.X, structs)
	case *ast.ArrayType:
		if id, ok := e.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return "string" // encoding/json writes []byte as base64
		}
		return "array<" + goType(e.Elt, structs) + ">"
	case *ast.MapType:
		return "object"
	case *ast.InterfaceType:
		return "any"
	case *ast.SelectorExpr:
		if fmt.Sprint(e.X) == "time" && e.Sel.Name == "Time" {
			return "string"
		}
		if fmt.Sprint(e.X) == "json" && e.Sel.Name == "RawMessage" {
			return "any"
		}
	case *ast.Ident:
		switch e.Name {
		case "string":
			return "string"
		case "bool":
			return "boolean"
		case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
			return "integer"
		case "float32", "float64":
			return "number"
		case "any":
			return "any"
		}
		if structs[e.Name] != nil {
			return "ref:" + e.Name
		}
	}
	return fmt.Sprintf("unknown:%T", e)
}

// clientAliasTargets maps each alias in package client of an api type to
// the api type's name.
func clientAliasTargets(t *testing.T, dir string) map[string]string {
	out := map[string]string{}
	for _, file := range goFiles(t, dir) {
		ast.Inspect(file, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Assign.IsValid() {
				if sel, ok := ts.Type.(*ast.SelectorExpr); ok && fmt.Sprint(sel.X) == "api" {
					out[ts.Name.Name] = sel.Sel.Name
				}
			}
			return true
		})
	}
	return out
}

func goFiles(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}
